"""The Pump: durable binlog storage (value log + ordered index), the sorter that
knows the safe ts, GC, and the gRPC service around them."""
