"""The fault campaign (issue 15): ``gpusched chaos`` / ``make chaos``.

It starts a stack of its own (a private PostgreSQL it can stop, a broker it can kill, two replicas of each
scaled service, simulated nodes and a probe node), runs a seeded workload of every shape, injects a seeded
schedule of faults one after another, measures how long the system takes to run new work after each, and
then checks the whole system's invariants from the event store and the runs' own records
(``checker``). ``schedule`` and ``checker`` are pure; ``campaign`` and ``faults`` are the shell.
"""
