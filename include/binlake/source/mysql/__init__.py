"""The MySQL/MariaDB row-binlog source: ``server`` (settings checks, positions),
``tables`` (definitions kept by parsing DDL), ``values`` (row values to the
codec), ``source`` (the replication loop, a ``source.base.Source``),
``commands`` (``binlake source mysql``)."""
