"""The load generator behind ``binlake workload``: a plan of transactions drawn
from a seed (``plan``, from the operations in ``ops``) run through TxnWriter by
client threads (``run``); ``api`` is the command and every public name in one
place, ``commands`` its parser (kept free of SQLAlchemy so the parser stays cheap)."""
