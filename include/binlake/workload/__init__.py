"""The load generator behind ``binlake workload``: realistic, reproducible load on
an upstream through TxnWriter (``binlake.writer``).

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

Modules: ``plan`` (the planner), ``ops`` (the operations a transaction is made
of and the values they write), ``run`` (the runner and its ``Summary``),
``commands`` (``binlake workload`` and ``binlake bench writer``).
"""
