"""The trace simulations: the pure decision cores (``gpusched_core``) replayed over public traces.

- ``placement``: ``gpusched simulate``, the Alibaba openb pods placed once each under the FGD protocol;
- ``queue``: ``gpusched simulate-queue``, Philly jobs in time through quota, fair share and preemption;
- ``preemption``: ``gpusched simulate-preemption``, openb pods in time (creation, deletion, QoS) with and
  without priority preemption.

Shared: ``traces`` (loading openb and Philly), ``clock`` (the event queue of the time-based replays),
``report`` and ``options`` (what the sub-commands print and parse alike). The simulations import only
``gpusched_core``, ``gpusched_common`` and each other's shared modules, never a service.
"""
