"""A submission: one job, or a pipeline of jobs submitted together from one file.

A pipeline is either a multi-document YAML stream (jobs separated by `---`) or one document
with a `jobs:` list. Its jobs refer to each other by name in `depends_on`, so names must be
unique inside the file. A reference that names no job of the file is kept as written: the
service reads it as the id of a job submitted earlier and refuses the whole submission if there
is none.

Checked here, each problem reported at its field: every job on its own (as `spec.job` does),
names unique, no job depending on itself or twice on one job, no dependency cycle. Nothing here
knows which jobs exist already.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aisched.core.dependencies import find_cycle
from aisched.spec.errors import (
    SpecError,
    describe,
    expanded_size_problem,
    not_unicode_problem,
    parse_yaml_all,
)
from aisched.spec.job import parse_job_document
from aisched.spec.job_common import DEFAULTS, JobDefaults, ParsedJob, Problems

MAX_PIPELINE_JOBS = 100  # more jobs in one file is a script's mistake, not a pipeline
# A job's dependencies are looked up again each time one of them ends, by the loop that
# schedules everyone: a user's thousands of jobs, each waiting on thousands, would stall it.
MAX_DEPENDENCIES = 100


@dataclass(frozen=True, slots=True)
class ParsedSubmission:
    """The jobs of one submission, in file order. Each job's `depends_on` holds references as
    written: a name of a job in `jobs`, else an existing job's id."""

    jobs: tuple[ParsedJob, ...]

    @property
    def is_pipeline(self) -> bool:
        return len(self.jobs) > 1 or any(p.job.depends_on for p in self.jobs)


def parse_submission_text(
    text: str, source: str, defaults: JobDefaults = DEFAULTS
) -> ParsedSubmission:
    """A submission from YAML (or JSON) text, one document or several."""
    docs = [d for d in parse_yaml_all(text, source) if d is not None]
    if (too_large := expanded_size_problem(docs)) is not None:
        raise SpecError(f"{source}: {too_large}")
    if len(docs) <= 1:
        return parse_submission_document(docs[0] if docs else None, source, defaults)
    return _pipeline(
        docs, [f"{source} (document {i + 1})" for i in range(len(docs))], source, defaults
    )


def parse_submission_document(
    data: Any, source: str, defaults: JobDefaults = DEFAULTS
) -> ParsedSubmission:
    """A submission from a parsed document: a job, or a mapping whose only key is `jobs`."""
    if (not_text := not_unicode_problem(data)) is not None:
        raise SpecError(f"{source}: {not_text}")
    if isinstance(data, dict) and "jobs" in data:
        extra = sorted(str(k) for k in data if k != "jobs")
        if extra:
            raise SpecError(
                f"{source}: {extra[0]}: unknown key next to jobs (put it inside each job)"
            )
        items = data["jobs"]
        if not isinstance(items, list) or not items:
            got = describe(items) if items else "an empty list"
            raise SpecError(f"{source}: jobs: expected a non-empty list of jobs, got {got}")
        return _pipeline(
            items, [f"{source}: jobs.{i}" for i in range(len(items))], source, defaults
        )
    return _pipeline([data], [source], source, defaults)


def _pipeline(
    docs: list[Any], sources: list[str], source: str, defaults: JobDefaults
) -> ParsedSubmission:
    if len(docs) > MAX_PIPELINE_JOBS:
        raise SpecError(f"{source}: {len(docs)} jobs, more than the limit of {MAX_PIPELINE_JOBS}")
    problems: list[str] = []
    parsed: list[ParsedJob] = []
    for doc, src in zip(docs, sources, strict=True):
        try:
            parsed.append(parse_job_document(doc, src, defaults))
        except SpecError as e:
            problems.extend(e.problems)
    if problems:
        raise SpecError(problems)
    names: dict[str, int] = {}
    for i, (p, src) in enumerate(zip(parsed, sources, strict=True)):
        name = p.job.name
        if name in names and len(parsed) > 1:
            problems.append(
                f"{src}: name: {name!r} is already the name of job {names[name] + 1} of this "
                "file; jobs of one file need distinct names"
            )
        names.setdefault(name, i)
        if len(p.job.depends_on) > MAX_DEPENDENCIES:
            problems.append(
                f"{src}: depends_on: {len(p.job.depends_on)} dependencies, more than the limit "
                f"of {MAX_DEPENDENCIES} (wait on fewer jobs that wait on the rest)"
            )
        seen: set[str] = set()
        for k, dep in enumerate(p.job.depends_on):
            at = Problems(src)
            if dep.job_id == name:
                at.add(f"depends_on.{k}", f"job {name!r} cannot depend on itself")
            elif dep.job_id in seen:
                at.add(f"depends_on.{k}", f"{dep.job_id!r} is listed twice")
            seen.add(dep.job_id)
            problems.extend(at.lines)
    if problems:
        raise SpecError(problems)
    edges = {p.job.name: [d.job_id for d in p.job.depends_on if d.job_id in names] for p in parsed}
    cycle = find_cycle(edges)
    if cycle is not None:
        raise SpecError(f"{source}: depends_on: dependency cycle: {' -> '.join(cycle)}")
    return ParsedSubmission(tuple(parsed))
