"""The lake's store: where the lake and its tables are (``location``), reaching
an S3 lake (``s3``, with ``s3object`` for single objects), the windows ledger
(``ledger``), the tables read as Arrow without Spark (``arrowread``), staged
Parquet handed to Spark (``staging``), and the writers' turns (``writelock``,
on S3 through the writer ``lease``).

Above Spark sessions (``binlake.lake.sparkenv``): the ledger falls back to a Spark
read, and a lost lease cancels the session's jobs.
"""

from __future__ import annotations
