"""Workload traces for the simulator: real public traces (Philly, openb) and a seeded generator.

Every loader returns a `Trace` whose jobs are sorted by arrival, the first arriving at 0.
"""

from __future__ import annotations

from aisched.sim.traces.base import (
    Trace,
    TraceError,
    TraceJob,
    find_traces_dir,
    fit_gangs_to,
    gpu_train_job,
    one_queue,
    resolve_trace_file,
    split_gpus,
)
from aisched.sim.traces.openb import load_openb_nodes, load_openb_pods
from aisched.sim.traces.philly import load_philly
from aisched.sim.traces.synthetic import synthetic_cluster, synthetic_trace

__all__ = [
    "Trace",
    "TraceError",
    "TraceJob",
    "find_traces_dir",
    "fit_gangs_to",
    "gpu_train_job",
    "load_openb_nodes",
    "load_openb_pods",
    "load_philly",
    "one_queue",
    "resolve_trace_file",
    "split_gpus",
    "synthetic_cluster",
    "synthetic_trace",
]
