"""Time-based queue simulator: Philly jobs through the pure quota core and the placement core.

``gpusched simulate-queue`` (``cli``) replays a window of the Philly trace with a virtual clock
(``engine``) under the policies of ``policies`` and reports the metrics of ``metrics``.
"""
