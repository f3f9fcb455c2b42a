"""``gpusched simulate-preemption``: the openb pods replayed in time, with and without preemption."""
