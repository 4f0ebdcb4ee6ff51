"""Point in time: typed snapshots, SCD2 history tables and restore to any commit_ts.

``columns``   codec types -> Spark types; image JSON -> typed columns, by column id
``layout``    where snapshots and history tables live in the lake, and their catalogs
``coverage``  what the ``windows`` ledger lets a restore promise (refusals name the fix)
``rebuild``   the state of one table at T: a base plus the changes after it, in Spark
``snapshot``  ``binlake snapshot``: typed Delta tables at a ts
``history``   ``binlake history``: one row per version of each row (SCD type 2)
``restore``   ``binlake restore``: resolve ts, check coverage, rebuild, write/load, verify
``naming``    where each restored table goes (--rename, --into-schema), every name checked first
``commands``  the CLI subcommands (registered in ``binlake.cli``)
"""
