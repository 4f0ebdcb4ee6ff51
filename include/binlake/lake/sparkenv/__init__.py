"""Spark for binlake: the one place a SparkSession is built (``session``, Delta
configured, jars local, UTC, the s3a settings of an S3 lake), Spark Connect
clients (``connect``) and the always-on Connect server (``connect_server``), and
binlake's errors rebuilt out of failed Spark jobs (``spark_errors``).

Below the store and the Pump readers, above decoding (whose errors a failed job
may carry) and ``binlake.lake.s3settings``.
"""

from __future__ import annotations
