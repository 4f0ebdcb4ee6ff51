"""The ingest DAG's own operators.

``WaitForSafeTsOperator``: the deferrable wait before a window is ingested.

It looks at the registry once from the worker; a window that is already
closed (every backfill and catch-up window, most scheduled ones) finishes
right there, without a trip through the triggerer. Otherwise it defers to
``SafeTsTrigger`` and gives its worker slot back while it waits.

``IngestSubmitOperator``: the Spark provider's ``SparkSubmitOperator`` for
``jobs/ingest.py``, which fails the task without retrying when the job exits
with ``binlake.errors.EXIT_FINAL`` (a window no retry can ingest), and whose
master is ``binlake_spark_master`` when that is set (a ``spark://`` cluster),
else the ``spark_default`` connection's.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from binlake_airflow.triggers import ERROR, GC_PASSED, READY, SafeTsTrigger, check_safe_ts, describe_waiting

if TYPE_CHECKING:
    from airflow.sdk import Context


class WaitForSafeTsOperator(BaseOperator):
    """Wait until every Pump of window ``[start_ts, end_ts)`` has a safe ts >= ``end_ts``.

    :param registry: registry HOST:PORT (templated)
    :param start_ts: window start, a TSO (templated; an XComArg resolves to the int)
    :param end_ts: window end (exclusive), a TSO (templated)
    :param pumps: node ids of the Pumps planned for the window (templated; a list,
        or a comma-separated string)
    :param poll_interval: seconds between registry polls; None reads the
        ``binlake_safe_ts_poll_s`` setting when the task runs
    :param wait_timeout: give up (and let the task retry) after this long deferred

    Returns (XCom) ``{"safe_ts": {pump: ts}, "pumps": [...], "deferred": bool}``.
    Fails without retrying when a Pump's GC ts passed the window start (the
    binlogs are gone; retrying cannot help), and with a retryable error when a
    planned Pump is no longer registered.
    """

    template_fields: Sequence[str] = ("registry", "start_ts", "end_ts", "pumps")
    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        registry: str,
        start_ts: int | str,
        end_ts: int | str,
        pumps: Sequence[str] | str,
        poll_interval: float | None = None,
        wait_timeout: dt.timedelta = dt.timedelta(hours=1),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.registry = registry
        self.start_ts = start_ts
        self.end_ts = end_ts
        self.pumps = pumps
        self.poll_interval = poll_interval
        self.wait_timeout = wait_timeout

    def _window(self) -> tuple[int, int, list[str]]:
        try:
            start_ts, end_ts = int(self.start_ts), int(self.end_ts)
        except (TypeError, ValueError):
            raise AirflowFailException(
                f"start_ts/end_ts must be integer TSOs, got {self.start_ts!r} and {self.end_ts!r}"
            ) from None
        if start_ts >= end_ts:
            raise AirflowFailException(f"window [{start_ts}, {end_ts}) is empty")
        pumps = self.pumps
        if isinstance(pumps, str):
            pumps = [p.strip() for p in pumps.split(",") if p.strip()]
        return start_ts, end_ts, list(pumps)

    def execute(self, context: Context) -> dict[str, Any]:
        from binlake import errors, tso
        from binlake.registry.client import RegistryClient
        from binlake.registry.replicas import cluster_min_acks
        from binlake_airflow import config

        start_ts, end_ts, pumps = self._window()
        poll = self.poll_interval if self.poll_interval is not None else config.poll_interval_s()
        window = f"[{tso.format_ts(start_ts)}, {tso.format_ts(end_ts)})"
        try:
            with RegistryClient(self.registry) as client:
                nodes, _revision = client.list_nodes("pump")
                acks = cluster_min_acks(client, start_ts, end_ts)
        except errors.BinlakeError as exc:
            # The trigger keeps polling through a registry outage; no need to fail here.
            self.log.warning("registry %s: %s; deferring to the triggerer", self.registry, exc)
        else:
            check = check_safe_ts(nodes, pumps, start_ts, end_ts, acks)
            if check.error is not None or check.ready:
                return self._finish(check.payload(start_ts, end_ts), deferred=False)
            self.log.info("window %s: %s", window, describe_waiting(check, nodes, end_ts))
        self.log.info("window %s: deferring; polling registry %s every %.1fs", window, self.registry, poll)
        self.defer(
            trigger=SafeTsTrigger(registry=self.registry, start_ts=start_ts, end_ts=end_ts, pumps=pumps,
                                  poll_interval=poll),
            method_name="execute_complete",
            timeout=self.wait_timeout,
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resumed by the trigger's event."""
        if not event:
            raise AirflowException("the safe-ts trigger ended without an event")
        return self._finish(event, deferred=True)

    def _finish(self, event: dict[str, Any], *, deferred: bool) -> dict[str, Any]:
        status = event.get("status")
        if status == ERROR:
            message = str(event.get("message") or "the window cannot be ingested")
            if event.get("kind") == GC_PASSED:
                raise AirflowFailException(message)
            raise AirflowException(message)
        if status != READY:
            raise AirflowException(f"unexpected event from the safe-ts trigger: {event!r}")
        safe_ts = {str(k): int(v) for k, v in (event.get("safe_ts") or {}).items()}
        self.log.info("every pump's safe ts reached the window end: %s", safe_ts)
        return {"safe_ts": safe_ts, "pumps": sorted(safe_ts), "deferred": deferred}


# binlake.errors.EXIT_FINAL, spelled here so this module imports nothing of
# binlake at parse time (a test checks the two agree).
EXIT_FINAL = 3
_ERROR_CODE = re.compile(r"Error code is: (\d+)")


class IngestSubmitOperator(SparkSubmitOperator):
    """``SparkSubmitOperator`` running ``jobs/ingest.py``: when the job exits with
    ``EXIT_FINAL`` (below a Pump's GC ts, overlapping an ingested window with other
    bounds, a bad argument) the task fails at once instead of spending its retries."""

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "master")

    def __init__(self, *, master: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # binlake_spark_master (rendered from the plan): when set, the master of this
        # spark-submit, over the spark_default connection's.
        self.master = master

    def _get_hook(self) -> Any:
        # The application's heaps are [memory]'s, as in every session binlake starts; under
        # spark-submit the driver's JVM is sized before the job's Python runs, so they go on
        # its command line (--driver-memory, --executor-memory) unless the task set them.
        from binlake import config

        bounds = config.memory()
        self._driver_memory = self._driver_memory or bounds.driver
        self._executor_memory = self._executor_memory or bounds.executor
        hook = super()._get_hook()
        master = str(self.master or "").strip()
        if master:
            # As the hook itself derives these from its connection's master.
            hook._connection["master"] = master
            hook._is_yarn = "yarn" in master
            hook._is_kubernetes = "k8s" in master
        return hook

    def execute(self, context: Context) -> None:
        try:
            super().execute(context)
        except AirflowFailException:
            raise
        except AirflowException as exc:
            if self._exit_code(exc) == EXIT_FINAL:
                raise AirflowFailException(
                    f"the ingest job refused the window and retrying cannot help (see its error above): {exc}"
                ) from None
            raise

    def _exit_code(self, exc: BaseException) -> int | None:
        # The hook keeps the finished spark-submit process; its message names the code too.
        process = getattr(self._hook, "_submit_sp", None)
        code = getattr(process, "returncode", None)
        if isinstance(code, int):
            return code
        match = _ERROR_CODE.search(str(exc))
        return int(match.group(1)) if match else None
