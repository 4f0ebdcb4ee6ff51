"""The writer library: an application's transactions run through ``TxnWriter``
(``txn_writer``), which sends each one's binlogs to the Pumps around the
database commit, and the TxnStatus service every upstream writer serves to the
Pumps (``txn_status``; the log-reading sources serve it too, from their journal)."""
