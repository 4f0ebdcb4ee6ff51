"""The registry: the placement service (PD's role) - TSO plus node status."""
