"""What-if on the cluster's own history (``gpusched whatif``): the recorded submissions replayed through
today's nodes under placement policies by name and, optionally, other tenancies (``engine``); figures per
run (``report``); the history as the gateway serves it (``history``)."""
