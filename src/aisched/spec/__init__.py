"""Input files read at the edge (cluster descriptions, ...), validated, turned into model types."""

from __future__ import annotations

from aisched.spec.cluster import (
    builtin_cluster,
    builtin_cluster_names,
    cluster_from_dict,
    load_cluster_file,
    resolve_cluster,
)
from aisched.spec.errors import SpecError, format_validation_error, parse_yaml
from aisched.spec.policy import load_policy, load_policy_file

__all__ = [
    "SpecError",
    "builtin_cluster",
    "builtin_cluster_names",
    "cluster_from_dict",
    "format_validation_error",
    "load_cluster_file",
    "load_policy",
    "load_policy_file",
    "parse_yaml",
    "resolve_cluster",
]
