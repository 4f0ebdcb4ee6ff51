"""Tooling for tests, the demo and benchmarks, not for production: a registry
with N Pumps as local processes (``devcluster``), etcd clusters, hosts as network
namespaces, an S3 server. The local database servers and Spark cluster that
``binlake up`` also runs are production code in ``binlake.stack``."""
