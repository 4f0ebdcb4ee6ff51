"""``binlake up``: the always-on local stack (registry, Pumps, Airflow) of `make up`.

``commands``    the ``binlake up`` parser and handler
``supervisor``  starting, watching and stopping the stack's processes
``airflow_db``  how Airflow's SQLite metadata database is opened on this machine
"""
