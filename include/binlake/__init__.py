"""binlake: incremental backup for transactional databases, in the shape of TiDB Binlog.

Pumps keep every transaction's binlog sorted by commit_ts; batch jobs pull
commit_ts windows into a Delta Lake change table and apply or restore from it.
"""

from __future__ import annotations

__version__ = "0.1.0"
