"""binlake's Airflow side: what the DAGs in ``dags/`` use to talk to binlake.

- ``config``: Airflow Connections and Variables as a settings source of
  ``binlake.config``'s model, above the ``BINLAKE_*`` environment: where tasks
  find the registry, the lake and Spark at run time; plus the ingest DAG's
  parse-time shape (schedule, start date, runs at once), from the environment.
- ``triggers``: ``SafeTsTrigger``, which waits in the triggerer (asyncio, no
  worker slot) until every planned Pump's safe ts has reached a window's end.
- ``operators``: ``WaitForSafeTsOperator``, the deferrable task around it.
- ``assets``: the Assets the binlake DAGs produce and consume.

Airflow puts ``plugins/`` on ``sys.path`` in every component (scheduler,
DAG processor, triggerer, task runner), so this package is imported as
``binlake_airflow``; no ``AirflowPlugin`` class is needed because nothing here
extends the UI or registers macros. The library itself lives in ``binlake``
(``include/binlake``); this package stays a thin adapter around it.
"""

from __future__ import annotations
