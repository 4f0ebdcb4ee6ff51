"""Decoding: a window's binlog transactions into the lake's rows.

The bottom layer of the lake, free of Spark, the store and the Pumps: complete
transactions (``txn``), table definitions by commit_ts (``schema_history``),
row images as JSON (``image``, with the optional C decoder behind ``native``),
change and DDL rows (``change_decoder``, ``ddl_rows``, ``rows``), their Arrow
batches (``arrow_batches``), and ``decode``, the names other code imports.
"""

from __future__ import annotations
