"""Upstream adapters: the writer side of the binlog (TiDB's role)."""
