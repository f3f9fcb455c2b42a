"""How accurate start-time estimates are (``gpusched simulate-estimates``): a replayed trace, the estimator
core run at sampled instants on what was known then, its estimates held against the actual starts."""
