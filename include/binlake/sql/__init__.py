"""SQL shared by every role: table definitions, the databases binlake writes, checksums.

``schema``    table definitions (``TableInfo``) and the DDL operations on them
``targets``   one module per database behind the ``Target`` interface (types, DDL, batch writes)
``dialect``   the targets' SQL by dialect name, for callers without a ``Target`` (the upstream writer)
``url``       database URLs binlake accepts, and connecting to one
``checksum``  one order-independent checksum per table, equal on every database

The upstream (``binlake.source``), the apply (``binlake.replicate``), the restore
and diff all import these; none of them owns them.
"""
