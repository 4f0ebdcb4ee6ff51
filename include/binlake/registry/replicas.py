"""The cluster's replication setting (replicas R, min_acks W) over time.

The registry keeps a history of settings, each applying to prewrites with
``start_ts`` from its ``from_ts`` on (``binlake ctl replication --set``); without
any, the ``[client] replicas`` / ``min_acks`` configuration applies (default 1:
no replication). Writers pick R and W for each prewrite by its start_ts
(``setting_at``). Readers need W to know how many unreachable Pumps a window may
be read without (``window.cluster_readiness``): a window holds transactions that
started up to a transaction's lifetime before it, so it is read with the lowest
W in force from that lifetime before its start to its end
(``min_acks_for_window``) - a change of R applies to reads only once every
transaction written under the old one has left the window. Windows before the
change are read with the W that was in force for them.

The lifetime is ``[client] txn_lookback_s`` (default ``TXN_LOOKBACK_MS``, the
Pumps' default txn_timeout_s): a promise about the upstream's transactions, not
something measured. It cannot be learnt from the Pumps: the copies of a
transaction are fixed when its prewrite is placed (a copy added later, after its
commit_ts was fetched, would arrive below a Pump's safe ts and be missed), and a
transaction placed under the old setting on an unreachable Pump alone can commit
at any point of its lifetime.
"""

from __future__ import annotations

from collections.abc import Sequence

from binlake import config, tso
from binlake.registry.model import ReplicationSetting

# How long before a window's start a transaction of the window may have started:
# the Pumps' default txn_timeout_s (10 min), after which a prewrite is resolved.
TXN_LOOKBACK_MS = 600_000
# Default lead of a new setting over now: writers re-read the history every
# refresh_interval_s (1 s by default), so all of them know it before it applies.
DEFAULT_GRACE_MS = 30_000


def configured() -> ReplicationSetting:
    """R and W from this process's configuration (environment), applying from TSO 0."""
    settings = config.load(config.ClientSettings)
    return ReplicationSetting(0, settings.replicas, settings.acks)


def configured_lookback_ms() -> int:
    """``[client] txn_lookback_s`` of this process's configuration, in ms."""
    return round(config.load(config.ClientSettings).txn_lookback_s * 1000)


def setting_at(history: Sequence[ReplicationSetting], ts: int,
               default: ReplicationSetting | None = None) -> ReplicationSetting:
    """The setting in force at ``ts``: the last with from_ts <= ts; before the first
    (or with none), ``default`` (R = W = 1 when not given)."""
    current = default or ReplicationSetting(0, 1, 1)
    for s in history:
        if s.from_ts > ts:
            break
        current = s
    return current


def min_acks_for_window(history: Sequence[ReplicationSetting], start_ts: int, end_ts: int,
                        default: ReplicationSetting | None = None, lookback_ms: int = TXN_LOOKBACK_MS) -> int:
    """The W a window ``[start_ts, end_ts)`` is read with: the lowest W in force
    from ``lookback_ms`` (the longest transaction) before its start up to its end."""
    if isinstance(lookback_ms, bool) or not isinstance(lookback_ms, int) or lookback_ms < 0:
        raise ValueError(f"lookback_ms must be an integer >= 0, got {lookback_ms!r}")
    lookback = tso.compose(max(0, tso.physical_ms(start_ts) - lookback_ms))
    acks = setting_at(history, lookback, default).min_acks
    for s in history:
        if lookback < s.from_ts < end_ts:
            acks = min(acks, s.min_acks)
    return acks


def cluster_min_acks(registry: object | None = None, start_ts: int = 0, end_ts: int = 0) -> int:
    """W for reading ``[start_ts, end_ts)``: from the registry's history when it has
    one (``registry``: a RegistryClient), else from the configuration."""
    default = configured()
    if registry is not None:
        from binlake.registry.client import RegistryClient

        assert isinstance(registry, RegistryClient)
        history = registry.get_replication()
        if history:
            return min_acks_for_window(history, start_ts, end_ts, ReplicationSetting(0, 1, 1),
                                       configured_lookback_ms())
    return default.min_acks
