"""What-if on the cluster's own history: the replay is the pure core ``gpusched_core.whatif`` (so the
gateway's POST /v1/whatif runs it too); these modules re-export it for the simulations that use it
(``simulate-estimates``) and keep what only a terminal needs (``report.table``)."""
