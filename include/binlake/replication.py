"""The cluster's replication setting as readers see it: W (``min_acks``).

Writers take R and W from ``[client] replicas`` / ``min_acks`` (``ClientSettings``).
Readers need W to know how many unreachable Pumps a window may be read without
(``window.cluster_readiness``); they take it from the same setting, read from the
environment (``BINLAKE_CLIENT_MIN_ACKS`` / ``BINLAKE_CLIENT_REPLICAS``), so one
deployment-wide value serves both sides. Readers must never use a W larger than
the writers' (that would skip a Pump holding the only copy); W = 1 is always safe.
"""

from __future__ import annotations

from binlake import config


def cluster_min_acks() -> int:
    """W as configured for this process (1 when nothing is set: no replication)."""
    return config.load(config.ClientSettings).acks
