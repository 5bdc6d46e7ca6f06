"""Input files read at the edge (cluster descriptions, policies, job files), validated, turned
into model types.

The names below are loaded on first use (PEP 562), so `import aisched.spec.units` — all a CLI
client needs — does not pull in the cluster, policy and job modules and the core behind them.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "builtin_cluster": "cluster",
    "builtin_cluster_names": "cluster",
    "cluster_from_dict": "cluster",
    "load_cluster_file": "cluster",
    "resolve_cluster": "cluster",
    "SpecError": "errors",
    "format_validation_error": "errors",
    "parse_yaml": "errors",
    "DEFAULT_PRIORITY_CLASSES": "job",
    "JobDefaults": "job",
    "ParsedJob": "job",
    "load_job_file": "job",
    "parse_job_document": "job",
    "parse_job_text": "job",
    "load_policy": "policy",
    "load_policy_file": "policy",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'aisched.spec' has no attribute {name!r}")
    return getattr(importlib.import_module(f"aisched.spec.{module}"), name)
