"""``binlake ctl``: operate the cluster (binlogctl's role).

``commands``   the ``binlake ctl`` parser and its dispatch (cheap to import)
``actions``    the actions themselves: Pumps, TSOs, dumps, checksums
``consumers``  ``ctl consumers`` / ``ctl remove-consumer``: who holds Pump GC
``registry``   ``ctl registry``: the registry group's members, leader, TSO mark, lease
"""
