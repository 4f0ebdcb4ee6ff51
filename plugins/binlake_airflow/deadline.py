"""The ingest DAG's lateness alert: an Airflow ``DeadlineAlert`` per window.

Each ``binlake_ingest`` run is one window ``[start, end)``. The window closes at
``end``; it should be in the lake a little later (the Pumps' safe ts passing
``end``, then one Spark job). When a run is still not done ``grace`` after its
window closed, Airflow's scheduler marks its deadline missed and the triggerer
runs a callback:

* by default ``window_late`` below: one WARNING line in the triggerer's log
  and, when ``BINLAKE_INGEST_DEADLINE_WEBHOOK`` is set, a JSON POST to that URL
  (``{"text": ..., "dag_id", "run_id", "window_start", "window_end", "deadline"}``;
  the ``text`` key is what Slack and Mattermost incoming webhooks show);
* or the user's own awaitable, named by ``BINLAKE_INGEST_DEADLINE_CALLBACK``
  (``package.module.function``, importable by the triggerer), called with the
  same keyword arguments and Airflow's ``context``.

Settings (``binlake.config.IngestDagSettings``: environment, read when the DAG
file is parsed, like the schedule: they shape the DAG): ``BINLAKE_INGEST_DEADLINE``
the grace (``15m`` by default, ``30s``/``5m``/``1h``; ``off`` disables the alert),
``BINLAKE_INGEST_DEADLINE_WEBHOOK``, ``BINLAKE_INGEST_DEADLINE_CALLBACK``.

Airflow measures the deadline from the run's logical date, which for the
ingest's interval timetables is the window's start; so the alert's interval is
the window's length plus the grace (a cron schedule's length is taken from its
first interval after the start date).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import urllib.request
from typing import Any

from binlake import config

log = logging.getLogger(__name__)

DEADLINE_ENV = config.env_names(config.IngestDagSettings, "deadline")[0]
WEBHOOK_ENV = config.env_names(config.IngestDagSettings, "deadline_webhook")[0]
CALLBACK_ENV = config.env_names(config.IngestDagSettings, "deadline_callback")[0]


def grace(text: str | None = None) -> dt.timedelta | None:
    """``BINLAKE_INGEST_DEADLINE`` (or ``text``; empty: the default) as a duration;
    None when the alert is off."""
    from binlake_airflow.config import dag_setting

    raw: str = dag_setting("deadline", text)
    if raw.lower() in config.DEADLINE_OFF:
        return None
    seconds = config.duration_seconds(raw)
    assert seconds is not None  # the model accepts durations and "off" only
    return dt.timedelta(seconds=seconds)


def window_length(timetable: Any, start: dt.datetime) -> dt.timedelta:
    """The length of the ingest's windows: a duration schedule's delta, or a cron
    schedule's first interval after ``start``."""
    delta = getattr(timetable, "delta", None)
    if isinstance(delta, dt.timedelta):
        return delta
    from croniter import croniter

    expression = getattr(timetable, "expression", None)
    it = croniter(str(expression), start)
    first = it.get_next(dt.datetime)
    return it.get_next(dt.datetime) - first  # type: ignore[no-any-return]


def alert(timetable: Any, start: dt.datetime) -> Any:
    """The ``DeadlineAlert`` of the ingest DAG (None when ``BINLAKE_INGEST_DEADLINE=off``)."""
    # The public path (airflow.sdk) exports these lazily, which mypy cannot see.
    from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference  # type: ignore[attr-defined]

    late = grace()
    if late is None:
        return None
    settings = config.load(config.IngestDagSettings)
    path, webhook = settings.deadline_callback, settings.deadline_webhook
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_LOGICAL_DATE,
        interval=window_length(timetable, start) + late,
        callback=AsyncCallback(path, kwargs={"webhook": webhook, "grace_s": late.total_seconds()}),
    )


def describe(context: dict[str, Any] | None, grace_s: float) -> dict[str, Any]:
    """The alert's payload from the callback's context (the run and its deadline)."""
    run = (context or {}).get("dag_run") or {}
    run_id = run.get("dag_run_id") or run.get("run_id")  # the REST model's name, or the ORM's
    deadline = (context or {}).get("deadline") or {}
    start, end = run.get("data_interval_start"), run.get("data_interval_end")
    text = (f"binlake: window {start} .. {end} of {run.get('dag_id', 'binlake_ingest')} is not in the lake "
            f"{grace_s:g}s after it closed (run {run_id}); "
            "see the run in Airflow and `binlake lake status`")
    return {"text": text, "dag_id": run.get("dag_id"), "run_id": run_id, "window_start": start,
            "window_end": end, "deadline": str(deadline.get("deadline_time"))}


def post(url: str, payload: dict[str, Any]) -> int:
    """POST ``payload`` as JSON to ``url`` (an alert webhook); the HTTP status."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(resp.status)


async def window_late(webhook: str | None = None, grace_s: float = 0.0,
                      context: dict[str, Any] | None = None) -> str:
    """The default deadline callback (runs in the triggerer): log the late window and
    POST it to the webhook, if one is set. A webhook that fails raises, so Airflow
    records the alert as not delivered. Returns the alert's line: Airflow stores a
    callback's result in a text column, so it must be a string."""
    payload = describe(context, grace_s)
    log.warning("%s", payload["text"])
    if webhook:
        status = await asyncio.to_thread(post, webhook, payload)
        return f"{payload['text']} (webhook answered {status})"
    return str(payload["text"])
