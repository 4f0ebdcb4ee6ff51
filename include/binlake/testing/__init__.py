"""Tooling for tests, the demo and benchmarks, not for production: throwaway
PostgreSQL/MariaDB servers (``devdb``) and a registry with N Pumps as local
processes (``devcluster``)."""
