"""Loading the public traces into the cores' values: ``openb`` (Alibaba nodes and pods, for the placement
and preemption simulations alike) and ``philly`` (Microsoft Philly jobs, for the queue simulation);
``location`` says where the traces are."""
