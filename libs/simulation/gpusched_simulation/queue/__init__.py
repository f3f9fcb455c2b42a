"""Time-based queue simulation: Philly jobs through the pure quota, placement and preemption cores.

``gpusched simulate-queue`` (``cli``) replays a window of the Philly trace with a virtual clock
(``engine``) under the policies of ``policies`` and reports the metrics of ``metrics``; ``preempt``
asks the live preemption core (``gpusched_core.preemption``) for the victims of reclaims and of
least-attained-service preemptions.
"""
