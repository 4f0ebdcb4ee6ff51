"""Restore drills: a restore into a scratch target, proved by independent means
(``proofs``: the apply targets, the lake's other restore paths, the upstream), its
RTO and RPO measured against the objectives, and recorded in ``LAKE/drills``."""
