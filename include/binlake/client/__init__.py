"""Clients of the Pump cluster: PumpClient (the writer's router), the window
reader, and (later) TxnWriter."""
