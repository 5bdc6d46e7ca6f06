"""Input files read at the edge (cluster descriptions, policies, job files), validated, turned
into model types."""

from __future__ import annotations

from aisched.spec.cluster import (
    builtin_cluster,
    builtin_cluster_names,
    cluster_from_dict,
    load_cluster_file,
    resolve_cluster,
)
from aisched.spec.errors import SpecError, format_validation_error, parse_yaml
from aisched.spec.job import (
    DEFAULT_PRIORITY_CLASSES,
    JobDefaults,
    ParsedJob,
    load_job_file,
    parse_job_document,
    parse_job_text,
)
from aisched.spec.policy import load_policy, load_policy_file

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "JobDefaults",
    "ParsedJob",
    "SpecError",
    "builtin_cluster",
    "builtin_cluster_names",
    "cluster_from_dict",
    "format_validation_error",
    "load_cluster_file",
    "load_job_file",
    "load_policy",
    "load_policy_file",
    "parse_job_document",
    "parse_job_text",
    "parse_yaml",
    "resolve_cluster",
]
