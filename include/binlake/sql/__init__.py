"""SQL shared by every role: table definitions, DDL operations and SQL per dialect.

``schema``   table definitions (``TableInfo``) and the DDL operations on them
``dialect``  what differs between SQLite, PostgreSQL and MySQL/MariaDB
``url``      database URLs binlake accepts, and connecting to one

The upstream (``binlake.source``), the apply (``binlake.replicate``), the restore
and the oracle all import these; none of them owns them.
"""
