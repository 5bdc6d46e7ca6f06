"""A seeded synthetic workload and a uniform synthetic cluster, for tests and benchmarks.

The same arguments (seed included) always give the identical trace: every draw comes from one
`random.Random(seed)` in a fixed order per job, and nothing else is random. Arrivals are a
Poisson process starting at 0; durations are lognormal with a heavy tail (sigma 1.5), as real
training traces are; user estimates are the true duration times lognormal noise, so a
predicted-shortest-first policy has something imperfect to work with.
"""

from __future__ import annotations

import math
import random

from aisched.model.cluster import GPU, Cluster, Node
from aisched.sim.traces.base import Trace, TraceJob, gpu_train_job

DEFAULT_GPU_SIZES: tuple[tuple[int, float], ...] = (
    (1, 0.7),
    (2, 0.1),
    (4, 0.1),
    (8, 0.07),
    (16, 0.02),
    (32, 0.01),
)
DURATION_SIGMA = 1.5
MIN_DURATION_S = 1.0
HIGH_PRIORITY = 10
HIGH_PRIORITY_SHARE = 0.1
NVLINK_GROUP_SIZE = 4


def synthetic_trace(
    num_jobs: int,
    *,
    seed: int,
    arrival_rate_per_h: float = 60.0,
    gpu_sizes: tuple[tuple[int, float], ...] = DEFAULT_GPU_SIZES,
    median_duration_s: float = 1800.0,
    num_queues: int = 2,
    num_users: int = 8,
    estimate_noise: float = 0.5,
) -> Trace:
    """`num_jobs` training jobs `syn-00000`, ...; `gpu_sizes` is (GPUs, weight) pairs.

    User `uK` submits to queue `q{K % num_queues}`, so each user belongs to one queue. One job in
    ten (in expectation) has priority 10, the rest 0. `estimate_noise` is the sigma of the
    estimate's log-error (0: exact estimates).
    """
    if num_jobs < 0:
        raise ValueError(f"num_jobs must be >= 0, got {num_jobs}")
    if not arrival_rate_per_h > 0:
        raise ValueError(f"arrival_rate_per_h must be positive, got {arrival_rate_per_h}")
    if not median_duration_s > 0:
        raise ValueError(f"median_duration_s must be positive, got {median_duration_s}")
    if num_queues < 1 or num_users < 1:
        raise ValueError("num_queues and num_users must be >= 1")
    if estimate_noise < 0:
        raise ValueError(f"estimate_noise must be >= 0, got {estimate_noise}")
    if not gpu_sizes or any(g < 1 or w < 0 for g, w in gpu_sizes):
        raise ValueError("gpu_sizes needs (gpus >= 1, weight >= 0) pairs")
    if sum(w for _, w in gpu_sizes) <= 0:
        raise ValueError("gpu_sizes weights must not all be zero")

    rng = random.Random(seed)
    sizes = [g for g, _ in gpu_sizes]
    weights = [w for _, w in gpu_sizes]
    rate_per_s = arrival_rate_per_h / 3600.0
    mu = math.log(median_duration_s)
    jobs: list[TraceJob] = []
    t = 0.0
    for i in range(num_jobs):
        # One draw of each kind per job, always in this order, so that changing one parameter
        # (say the noise) leaves the other quantities of every job as they were.
        gap = rng.expovariate(rate_per_s)
        gpus = rng.choices(sizes, weights)[0]
        duration = max(rng.lognormvariate(mu, DURATION_SIGMA), MIN_DURATION_S)
        noise = rng.lognormvariate(0.0, estimate_noise)
        user = rng.randrange(num_users)
        high = rng.random() < HIGH_PRIORITY_SHARE
        if i:
            t += gap
        job = gpu_train_job(
            f"syn-{i:05d}",
            gpus,
            user=f"u{user}",
            queue=f"q{user % num_queues}",
            submit_time_s=t,
            priority=HIGH_PRIORITY if high else 0,
            estimate_s=max(duration * noise, MIN_DURATION_S),
        )
        jobs.append(TraceJob(job=job, duration_s=duration, source="synthetic"))
    return Trace(name=f"synthetic-{seed}", jobs=tuple(jobs))


def synthetic_cluster(
    num_nodes: int,
    *,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 16,
    racks_per_zone: int = 8,
    gpu_model: str = "A100",
    milli_cpu: int = 96000,
    mem_mib: int = 1_048_576,
    gpu_mem_mib: int = 81920,
) -> Cluster:
    """`num_nodes` identical nodes `node-00000`, ... filled into racks, then zones, in order.

    GPUs form NVLink groups of 4 by index (0-3 in group 0, 4-7 in group 1, ...).
    """
    if num_nodes < 0 or gpus_per_node < 0:
        raise ValueError("num_nodes and gpus_per_node must be >= 0")
    if nodes_per_rack < 1 or racks_per_zone < 1:
        raise ValueError("nodes_per_rack and racks_per_zone must be >= 1")
    gpus = tuple(
        GPU(index=g, model=gpu_model, mem_mib=gpu_mem_mib, nvlink_group=g // NVLINK_GROUP_SIZE)
        for g in range(gpus_per_node)
    )
    nodes = []
    for i in range(num_nodes):
        rack = i // nodes_per_rack
        nodes.append(
            Node(
                name=f"node-{i:05d}",
                milli_cpu=milli_cpu,
                mem_mib=mem_mib,
                gpus=gpus,
                zone=f"zone-{rack // racks_per_zone:02d}",
                rack=f"rack-{rack:03d}",
            )
        )
    return Cluster(nodes=tuple(nodes))
