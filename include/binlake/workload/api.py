"""``binlake workload``: realistic, reproducible load on an upstream through TxnWriter.

A run has two halves that never mix:

* ``plan(profile, tables, txns, seed)`` is a pure function: it draws every
  logical transaction from one ``random.Random(seed)``, keeping a model of the
  schema (table and column names, types, unique keys) and of which primary keys
  exist "on paper". The same arguments always give an equal plan.
* ``run(writer, plan, clients, rate)`` executes the plan with C client threads
  that take transactions from one shared iterator, in plan order.

Clients run concurrently, so a transaction may execute before one that precedes
it in the plan. Every transaction is therefore written to be valid in *any*
order: inserts only use primary keys never handed out before (one counter per
table), unique values are fresh or swapped, and operations on existing rows
re-read them inside the transaction (``txn.get``) and do nothing when the row
is gone. A DDL is a barrier: it starts only after every earlier transaction
finished, and nothing after it starts before it is done, so DML always sees the
schema the planner assumed. With one client the whole run, and so the final
data, is a pure function of the plan.

Profiles: ``oltp`` (sysbench-like tables ``sbtest{i}``), ``bank`` (transfers
between accounts; the sum of balances never changes), ``ddl`` (oltp with
schema changes every ~50 transactions) and ``mixed`` (all of them).

The plan lives in ``binlake.workload.plan`` (operations and values in
``binlake.workload.ops``), the runner and its summary in ``binlake.workload.run``;
this module is the ``binlake workload`` command and keeps every public name
importable from here (its parser is ``binlake.workload.commands``).
"""

from __future__ import annotations

import argparse
import json

from binlake.workload.ops import (
    BANK_INITIAL_BALANCE,
    BANK_TABLE,
    DDL,
    PROFILES,
    WIDE_BYTES,
    ChangeKey,
    Delete,
    DeleteRange,
    Generate,
    Insert,
    LogicalTxn,
    Op,
    Reinsert,
    SwapUnique,
    Transfer,
    Update,
    UpdateRange,
    WideUpdate,
)
from binlake.workload.plan import plan
from binlake.workload.run import Summary, bank_total, format_summary, run
from binlake.writer.txn_writer import TxnWriter

__all__ = [
    "BANK_INITIAL_BALANCE", "BANK_TABLE", "DDL", "PROFILES", "WIDE_BYTES", "ChangeKey", "Delete", "DeleteRange",
    "Generate", "Insert", "LogicalTxn", "Op", "Reinsert", "Summary", "SwapUnique", "Transfer", "Update",
    "UpdateRange", "WideUpdate", "bank_total", "command", "format_summary", "plan", "run",
]


# ---------------------------------------------------------------- the command
def command(args: argparse.Namespace, registry: str) -> int:
    """``binlake workload``: plan, run, print the summary."""
    txns = plan(args.profile, args.tables, args.txns, args.seed, large_txn_rows=args.large_txn_rows,
                large_txn_every=args.large_txn_every, ddl_every=args.ddl_every, table_rows=args.table_rows,
                accounts=args.accounts)
    with TxnWriter(args.upstream, registry=registry) as writer:
        summary = run(writer, txns, args.clients, args.rate, progress=not args.quiet)
    if args.json:
        print(json.dumps({"profile": args.profile, "seed": args.seed, **summary.to_dict()}))
    else:
        print(format_summary(summary, f"workload {args.profile} (seed {args.seed})"))
    return 130 if summary.interrupted else 0
