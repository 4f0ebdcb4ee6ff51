"""Replicate: take the lake's change table to target databases.

filter -> route -> expression filter (``rules``) -> compact (``compactor``) ->
causality (``causality``) -> apply (through the target's ``binlake.sql.targets.Target``)
with a checkpoint in the target (``checkpoint``), window by window in commit_ts order (``runner``); ``diff``
compares two databases chunk by chunk.
"""
