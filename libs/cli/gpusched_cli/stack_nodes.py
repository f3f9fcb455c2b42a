"""The local stack's nodes: single agents and fleets of simulated nodes, and their GPU specs."""

from __future__ import annotations


def node_specs(nodes: int, gpu_models: list[str], gpus_per_node: int) -> list[tuple[str, str]]:
    """node id -> simulated GPU spec; models alternate across nodes. A model may carry agent options after
    `+`: `A100-80GB+mig` is a node whose GPUs are in MIG mode."""
    specs = []
    for i in range(nodes):
        model, *options = gpu_models[i % len(gpu_models)].split("+")
        specs.append((f"node-{i + 1}", ":".join([model, str(gpus_per_node), *options])))
    return specs


def fleet_specs(fleet: int, processes: int, gpu_models: list[str], gpus_per_node: int) -> list[tuple[str, int, str]]:
    """(process prefix, node count, simulated GPU spec) of each fleet process: ``fleet`` simulated nodes split
    as evenly as can be over ``processes`` processes, models alternating across the processes. A fleet's
    nodes are ``<prefix>-0001``.. (``services.node_agent.fleet.fleet_node_ids``)."""
    processes = max(1, min(processes, fleet))
    out = []
    for k in range(processes):
        count = fleet // processes + (1 if k < fleet % processes else 0)
        model, *options = gpu_models[k % len(gpu_models)].split("+")
        out.append((f"fleet{k + 1}", count, ":".join([model, str(gpus_per_node), *options])))
    return [spec for spec in out if spec[1] > 0]


def capacity_specs(nodes: int, gpu_models: list[str], gpus_per_node: int, fleet: int = 0,
                   fleet_processes: int = 1) -> list[tuple[str, str]]:
    """A (node, spec) pair per node of the stack, single agents and fleets alike (the local tenancy's
    capacity)."""
    specs = node_specs(nodes, gpu_models, gpus_per_node)
    for prefix, count, spec in fleet_specs(fleet, fleet_processes, gpu_models, gpus_per_node) if fleet else []:
        specs += [(f"{prefix}-{i}", spec) for i in range(count)]
    return specs
