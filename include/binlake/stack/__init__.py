"""``binlake up``: the always-on local stack (registry, Pumps, Airflow) of `make up`.

``commands``      the ``binlake up`` parser and handler
``supervisor``    starting, watching and stopping the stack's processes
``airflow_db``    how Airflow's metadata database is opened on this machine
``localdb``       database servers as local processes (Airflow's PostgreSQL; the
                  tests, demo and benchmarks start them as throwaway servers too)
``sparkcluster``  a Spark standalone cluster as local processes (``--spark-cluster``)
``procs``         stopping a child's process group

Production code: ``binlake.testing`` builds on these, never the other way round.
"""
