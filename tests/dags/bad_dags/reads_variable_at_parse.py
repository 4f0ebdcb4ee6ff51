"""A DAG file that breaks the rules on purpose: it reads an Airflow Variable
while it is parsed. test_dag_integrity checks that the guard reports it."""

from __future__ import annotations

import datetime as dt

from airflow.sdk import Variable, dag, task


@dag(
    dag_id="reads_variable_at_parse",
    schedule=None,
    start_date=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
    catchup=False,
    tags=["test"],
    doc_md=__doc__,
    default_args={"retries": 1},
)
def reads_variable_at_parse() -> None:
    @task
    def show(value: str) -> str:
        return value

    show(Variable.get("binlake_registry", default="127.0.0.1:8230"))  # on purpose: the guard must report this


reads_variable_at_parse()
