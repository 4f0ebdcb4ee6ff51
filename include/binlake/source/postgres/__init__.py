"""The PostgreSQL logical-decoding source (pgoutput over a replication slot)."""
