"""Pipeline files: a multi-document stream or a `jobs:` list, names resolved, bad input named."""

from __future__ import annotations

from pathlib import Path

import pytest

from aisched.model.job import Dependency, DependencyCondition
from aisched.spec.errors import SpecError
from aisched.spec.pipeline import parse_submission_document, parse_submission_text

MULTI = """\
name: prep
command: python prep.py
---
name: train
command: python train.py
depends_on: [prep]
---
name: report
command: python report.py
depends_on:
  - {job: train, condition: any}
  - 17
"""


def test_a_multi_document_file_is_a_pipeline_with_references_as_written() -> None:
    sub = parse_submission_text(MULTI, "p.yaml")
    assert sub.is_pipeline
    assert [(p.job.name, p.job.depends_on) for p in sub.jobs] == [
        ("prep", ()),
        ("train", (Dependency("prep"),)),
        ("report", (Dependency("train", DependencyCondition.ANY), Dependency("17"))),
    ]


def test_a_jobs_list_is_the_same_pipeline() -> None:
    doc = {
        "jobs": [
            {"name": "prep", "command": "python prep.py"},
            {"name": "train", "command": "python train.py", "depends_on": ["prep"]},
        ]
    }
    sub = parse_submission_document(doc, "p.json")
    assert [p.job.name for p in sub.jobs] == ["prep", "train"]


def test_one_job_without_dependencies_is_no_pipeline() -> None:
    sub = parse_submission_text("command: echo hi\n", "j.yaml")
    assert not sub.is_pipeline and len(sub.jobs) == 1


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "jobs: [{name: a, command: x, depends_on: [b]},\n"
            "       {name: b, command: y, depends_on: [a]}]",
            ["p.yaml: depends_on: dependency cycle: a -> b -> a"],
        ),
        (
            "name: a\ncommand: x\ndepends_on: [a]\n",
            ["p.yaml: depends_on.0: job 'a' cannot depend on itself"],
        ),
        (
            "jobs: [{name: a, command: x}, {name: b, command: y, depends_on: [a, a]}]",
            ["p.yaml: jobs.1: depends_on.1: 'a' is listed twice"],
        ),
        (
            "jobs: [{name: a, command: x}, {name: a, command: y}]",
            [
                "p.yaml: jobs.1: name: 'a' is already the name of job 1 of this file; "
                "jobs of one file need distinct names"
            ],
        ),
        ("jobs: []", ["p.yaml: jobs: expected a non-empty list of jobs, got an empty list"]),
        (
            "jobs: [{command: x}]\nqueue: q",
            ["p.yaml: queue: unknown key next to jobs (put it inside each job)"],
        ),
        (
            "jobs: [{name: a, command: x, depends_on: [{job: b, condition: maybe}]}]",
            [
                "p.yaml: jobs.0: depends_on.0.condition: expected 'success' or 'any', got 'maybe' "
                "(a string)"
            ],
        ),
        (
            "name: a\ncommand: x\ndepends_on: [" + ", ".join(map(str, range(1, 102))) + "]\n",
            [
                "p.yaml: depends_on: 101 dependencies, more than the limit of 100 (wait on "
                "fewer jobs that wait on the rest)"
            ],
        ),
        (
            "name: a\ncommand: x\n---\nname: b\n",
            ["p.yaml (document 2): command: a job needs a command (or a list of tasks)"],
        ),
    ],
)
def test_bad_pipelines_name_the_field(text: str, want: list[str]) -> None:
    with pytest.raises(SpecError) as e:
        parse_submission_text(text, "p.yaml")
    assert list(e.value.problems) == want


def test_the_example_pipeline() -> None:
    path = Path(__file__).resolve().parents[3] / "examples" / "pipelines"
    text = (path / "preprocess-train-evaluate.yaml").read_text()
    sub = parse_submission_text(text, "p.yaml")
    assert [(p.job.name, p.job.depends_on) for p in sub.jobs] == [
        ("preprocess", ()),
        ("train", (Dependency("preprocess"),)),
        ("evaluate", (Dependency("train"),)),
        ("cleanup", (Dependency("evaluate", DependencyCondition.ANY),)),
    ]


def test_aliases_that_write_out_past_the_job_file_limit_are_refused() -> None:
    """A 100 KB file of 2,000 aliases to one 100 KB string stands for a 200 MB command; the
    service stored and answered it (4.8 s and 1 GB of its memory, 400 MB more of database).
    Refused, in a walk that stops at the limit, however the aliases nest (a billion laughs:
    9 levels of 10 aliases each stand for 10^9 strings)."""
    big = "x" * 100_000
    fan_out = f"name: a\ncommand: [echo, &b {big}, {', '.join(['*b'] * 2000)}]\n"
    laughs = ["name: a", 'x0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    laughs += [f"x{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    laughs.append("command: *l9")
    for text in (fan_out, "\n".join(laughs), f"name: a\ncommand: echo\n---\n{fan_out}"):
        with pytest.raises(SpecError) as e:
            parse_submission_text(text, "bomb.yaml")
        assert e.value.problems == (
            "bomb.yaml: larger than 1 MiB with its aliases (*name) written out; no job file "
            "is that large",
        )


def test_aliases_that_share_a_few_values_are_fine() -> None:
    text = """\
jobs:
  - name: prep
    command: python prep.py
    env: &env {DATA: /data, SEED: "1"}
  - name: train
    command: python train.py
    env: *env
"""
    sub = parse_submission_text(text, "p.yaml")
    assert [dict(p.job.groups[0].env) for p in sub.jobs] == [{"DATA": "/data", "SEED": "1"}] * 2
