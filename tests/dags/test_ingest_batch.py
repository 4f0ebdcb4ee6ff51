"""Which windows an ingest run takes with its own: the closed data intervals after
it (a duration schedule), and a window an earlier run's batch ingested after this
run started is not ingested again (a run cleared to re-ingest starts anew)."""

from __future__ import annotations

import datetime as dt

from binlake_airflow import config, ingest_tasks

T0 = dt.datetime(2026, 11, 20, 0, 0, tzinfo=dt.UTC)
FIVE = dt.timedelta(minutes=5)


def test_following_windows_are_the_next_data_intervals_closed_by_now() -> None:
    timetable = config.ingest_timetable("5m")
    now = T0 + 3 * FIVE + dt.timedelta(seconds=30)  # [5m, 10m) and [10m, 15m) have closed, [15m, 20m) not
    got = ingest_tasks.following_windows(timetable, T0, T0 + FIVE, 11, now=now)
    assert got == [list(ingest_tasks.window_ts(T0 + FIVE, T0 + 2 * FIVE)),
                   list(ingest_tasks.window_ts(T0 + 2 * FIVE, T0 + 3 * FIVE))]
    assert ingest_tasks.following_windows(timetable, T0, T0 + FIVE, 1, now=now) == got[:1]
    assert ingest_tasks.following_windows(timetable, T0, T0 + FIVE, 0, now=now) == []
    # A cron schedule's intervals are not known here: no batch.
    assert ingest_tasks.following_windows(config.ingest_timetable("*/5 * * * *"), T0, T0 + FIVE, 11, now=now) == []


def test_a_window_ingested_after_the_run_started_is_not_ingested_again() -> None:
    a, b = ingest_tasks.window_ts(T0, T0 + FIVE)
    row = {"start_ts": a, "end_ts": b, "status": "done", "rows": 7,
           "ingested_at": (T0 + 2 * FIVE).replace(tzinfo=None)}
    assert ingest_tasks._ingested_since([row], a, b, T0 + FIVE) == row
    # Ingested before this run (re)started: re-run means re-ingest.
    assert ingest_tasks._ingested_since([row], a, b, T0 + 3 * FIVE) is None
    assert ingest_tasks._ingested_since([row], a, b, None) is None
    assert ingest_tasks._ingested_since([row], a, b + 1, T0) is None
