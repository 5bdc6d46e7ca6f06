"""Job files and request bodies: one entry point that tells the formats apart and builds a `Job`.

A document with `apiVersion: batch.volcano.sh/v1alpha1` and `kind: Job` is a Volcano Job
(`job_volcano`); a document with any other `apiVersion` is refused, saying what is accepted;
anything else is a native job file (`job_native`). docs/jobs.md is the reference for both.

Invariants: every problem in the input is raised as one `SpecError` listing all the problems
found, each `source: field.path: message`; PyYAML's and pydantic's exceptions never escape. The
`Job` returned has `id=""` and `submit_time_s=0.0`, and its `user` is the file's or the
defaults': the service assigns ids, submit times and (where it knows better) the user. Nothing
here touches the store, the clock or the cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aisched.model.job import JobKind
from aisched.spec.errors import (
    SpecError,
    describe,
    expanded_size_problem,
    parse_yaml,
    read_text_file,
)
from aisched.spec.job_common import (
    DEFAULT_PRIORITY_CLASSES,
    DEFAULTS,
    JobDefaults,
    ParsedJob,
)
from aisched.spec.job_native import native_job
from aisched.spec.job_volcano import API_VERSION, KIND, volcano_job

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "JobDefaults",
    "ParsedJob",
    "load_job_file",
    "parse_job_document",
    "parse_job_text",
]

_ACCEPTED = (
    f"aisched reads Volcano Jobs (apiVersion: {API_VERSION}, kind: {KIND}) and native job "
    "files (no apiVersion)"
)


def parse_job_text(text: str, source: str, defaults: JobDefaults = DEFAULTS) -> ParsedJob:
    """A job from YAML (or JSON) text; `source` names it in messages (a file name, `<stdin>`)."""
    data = parse_yaml(text, source)
    if (too_large := expanded_size_problem([data])) is not None:
        raise SpecError(f"{source}: {too_large}")
    return parse_job_document(data, source, defaults)


def parse_job_document(data: Any, source: str, defaults: JobDefaults = DEFAULTS) -> ParsedJob:
    """A job from an already parsed document (e.g. a JSON request body)."""
    if not isinstance(data, dict):
        raise SpecError(
            f"{source}: expected a job: a mapping with a command or tasks, or a Volcano Job; "
            f"got {'an empty document' if data is None else describe(data)}"
        )
    if "apiVersion" in data:
        api, kind = data.get("apiVersion"), data.get("kind")
        if api != API_VERSION:
            raise SpecError(f"{source}: apiVersion: {api!r} is not accepted; {_ACCEPTED}")
        if kind != KIND:
            raise SpecError(f"{source}: kind: {API_VERSION} {kind!r} is not accepted; {_ACCEPTED}")
        return volcano_job(data, source, defaults)
    kind = data.get("kind")
    if isinstance(kind, str) and kind[:1].isupper() and kind not in set(JobKind):
        raise SpecError(
            f"{source}: kind: {kind!r} without apiVersion; a Volcano Job needs "
            f"apiVersion: {API_VERSION}, and a native job's kind is train, infer, batch or service"
        )
    return native_job(data, source, defaults)


def load_job_file(path: str | Path, defaults: JobDefaults = DEFAULTS) -> ParsedJob:
    """Read and convert one job file; every problem (unreadable file included) is a SpecError."""
    return parse_job_text(read_text_file(path), str(path), defaults)
