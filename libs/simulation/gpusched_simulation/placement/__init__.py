"""Placement replay: the Alibaba openb traces through the pure placement core (FGD protocol).

Entry points: ``cli.add_simulate_parser`` / ``cli.run_simulate`` (the ``gpusched simulate``
sub-command) and ``replay.replay`` for one (policy, seed) run.
"""
