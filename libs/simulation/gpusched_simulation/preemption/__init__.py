"""``gpusched simulate-preemption``: the openb pods replayed in time, with and without preemption.

``workload`` turns the openb pods into timed jobs on a sample of its nodes, ``engine`` replays them on the
virtual clock asking the live preemption core (``gpusched_core.preemption``) for victims, ``metrics``
reports high-priority waits and the GPU time preemption costs.
"""
