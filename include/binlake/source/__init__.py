"""Sources: back up an existing database from its own change log, without
touching its application (the MySQL/MariaDB row binlog in ``mysql``, PostgreSQL
logical decoding in ``postgres``). ``base.Source`` is what a source implements;
the framework it builds on is ``emitter``, ``journal``, ``pipeline``,
``snapshot_group``, ``readburst`` and ``tables``; ``commands`` is ``binlake
source``; ``replay`` rebuilds rows from binlogs to check a source end to end.
(The writer library an application uses instead is ``binlake.writer``.)"""
