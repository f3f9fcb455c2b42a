"""What a placement becomes (pure): the ``gpu_allocations`` rows that hold its GPUs, and the ``StartJob``
each member's node agent gets, with what the job learns of its gang, host resources and checkpoint."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from datetime import datetime

from gpusched_common import events as ev

from gpusched_core.arrays import array_env
from gpusched_core.placement.cycle import Placement
from gpusched_core.placement.mig import MIG_MEMORY_SLICES
from gpusched_core.placement.model import MILLI_PER_GPU

AllocationRow = tuple  # the columns of ``placement_store.ALLOCATION_COLUMNS``, in order


def allocation_rows(placement: Placement, now: datetime) -> list[AllocationRow]:
    """gpu_allocations rows: one per whole GPU of every member, or the one share / MIG instance. A MIG
    instance charges its part of the GPU's memory slices (at least 1 milli), so no whole GPU or share can
    join it on that GPU. The job's host CPU and memory ride on its first (lowest) GPU of each node
    (``host_row_gpu``; migration 014), so whatever gives the GPUs back gives them back too."""
    job, host = placement.job_id, (placement.cpu_milli, placement.memory_mib)
    if placement.mig_profile is not None:
        slices = placement.mig_memory_slices or 1
        milli = max(1, slices * MILLI_PER_GPU // MIG_MEMORY_SLICES)
        return [(placement.node_id, placement.gpu_indices[0], job, now, milli, 0, placement.mig_profile,
                 placement.mig_start, slices, *host)]
    if placement.share_milli is not None:
        return [(placement.node_id, placement.gpu_indices[0], job, now, placement.share_milli,
                 placement.share_memory_mib or 0, None, None, None, *host)]
    return [(m.node_id, i, job, now, MILLI_PER_GPU, 0, None, None, None,
             *(host if i == host_row_gpu(m.gpu_indices) else (0, 0)))
            for m in placement.all_members for i in m.gpu_indices]


def host_row_gpu(gpu_indices: tuple[int, ...] | list[int]) -> int:
    """The GPU whose allocation row carries a job's host CPU and memory on a node: its lowest."""
    return min(gpu_indices)


def start_commands(placement: Placement, spec: ev.JobSpec, *, attempt: int, checkpoint_ref: str | None,
                   hostnames: Mapping[str, str], epochs: Mapping[str, int] | None = None) -> list[ev.StartJob]:
    """One ``StartJob`` per member of the placement (rank order), for its node's agent; ``epochs``: each
    node's lease epoch, the run's fencing token (an agent at another epoch ignores the command)."""
    return [ev.StartJob(job_id=placement.job_id, node_id=member.node_id, tenant=spec.tenant,
                        gpu_indices=list(member.gpu_indices), gpu_uuids=list(member.gpu_uuids),
                        command=spec.command, image=spec.image, args=spec.args, env={**resume_env(spec.env, checkpoint_ref),
                                                   **host_env(placement, spec.env),
                                                   **gang_env(placement, rank, hostnames, attempt, spec.env),
                                                   **array_env(spec.array)},
                        attempt=attempt, gpu_share_milli=placement.share_milli,
                        gpu_memory_mib=placement.share_memory_mib or None, mig_profile=placement.mig_profile,
                        mig_start=placement.mig_start, time_limit_s=spec.time_limit_s,
                        lease_epoch=(epochs or {}).get(member.node_id), cpu_milli=placement.cpu_milli,
                        host_memory_mib=placement.memory_mib)
            for rank, member in enumerate(placement.all_members)]


def gang_env(placement: Placement, rank: int, hostnames: Mapping[str, str], attempt: int = 1,
             env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What each member of a gang learns about the others: gpusched's own names, the rendezvous torchrun
    reads from its ``PET_*`` variables (so ``torchrun train.py`` with no flags joins the gang), and what
    Kubeflow's PyTorchJob sets (``MASTER_ADDR``/``MASTER_PORT``, ``WORLD_SIZE`` the members, ``RANK`` this
    one's; torchrun sets its workers' own). The port is the same on every member, from the job and attempt.
    Processes per node are the member's GPUs unless the job's ``env`` sets ``PET_NPROC_PER_NODE`` itself
    (a PyTorchJob's ``nprocPerNode``)."""
    if not placement.members:
        return {}
    nodes = [m.node_id for m in placement.members]
    master, port, size = hostnames.get(nodes[0], nodes[0]), str(master_port(placement.job_id, attempt)), str(len(nodes))
    per_node = (env or {}).get("PET_NPROC_PER_NODE") or str(len(placement.members[rank].gpu_indices))
    return {"GPUSCHED_GANG_SIZE": size, "GPUSCHED_GANG_RANK": str(rank), "GPUSCHED_GANG_NODES": ",".join(nodes),
            "NNODES": size, "NODE_RANK": str(rank), "MASTER_ADDR": master, "MASTER_PORT": port,
            "WORLD_SIZE": size, "RANK": str(rank),
            "PET_NNODES": size, "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": per_node,
            "PET_MASTER_ADDR": master, "PET_MASTER_PORT": port}


MASTER_PORTS = (20000, 30000)  # the range a gang's rendezvous port is drawn from


def master_port(job_id: str, attempt: int) -> int:
    """The rendezvous port of a gang's run: stable for the run, different for the next attempt (a port the
    last run's master may still hold in TIME_WAIT is not reused at once)."""
    low, high = MASTER_PORTS
    return low + zlib.crc32(f"{job_id}#{attempt}".encode()) % (high - low)


def host_env(placement: Placement, env: Mapping[str, str]) -> dict[str, str]:
    """What a job learns of the host CPU and memory it holds on its node; ``OMP_NUM_THREADS`` follows its
    whole CPUs unless the job sets its own (many CPU thread pools size themselves from it)."""
    out = {}
    if placement.cpu_milli:
        out["GPUSCHED_CPU_MILLI"] = str(placement.cpu_milli)
        if "OMP_NUM_THREADS" not in env:
            out["OMP_NUM_THREADS"] = str(max(1, placement.cpu_milli // 1000))
    if placement.memory_mib:
        out["GPUSCHED_MEMORY_MIB"] = str(placement.memory_mib)
    return out


def resume_env(env: Mapping[str, str], checkpoint_ref: str | None) -> dict[str, str]:
    """The job's environment; a job resuming after a preemption learns its last checkpoint."""
    if checkpoint_ref is None:
        return dict(env)
    return {**env, "GPUSCHED_RESUME_FROM": checkpoint_ref}
