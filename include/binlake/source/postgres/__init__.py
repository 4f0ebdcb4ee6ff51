"""The PostgreSQL logical-decoding source (pgoutput over a replication slot):
``values`` (definitions and tuple values), ``snapshot`` (the initial snapshot),
``source`` (the stream, a ``source.base.Source``), ``commands`` (``binlake
source postgres``)."""
