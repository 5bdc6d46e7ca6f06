"""Bad job files and `aisched run` flags, generated: refused in `source: field: message` lines,
never an exception of another kind (which the service would answer 500 and the CLI print as a
traceback).

`aisched submit FILE` sends the file's text as it is and the service reads it with
`parse_submission_text`; `aisched run` builds its document with `run_document` (flags checked
there, `CLIError`) and the service reads that with `parse_submission_document`. Both are driven
here in process; tests/e2e/test_bad_input_cli_e2e.py runs the real commands' error paths.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import yaml
from bad_input import BAD_VALUES, DEEP, SETTINGS, Mutation, mutated
from hypothesis import given
from hypothesis import strategies as st

from aisched.cli.errors import CLIError
from aisched.cli.jobs import run_document
from aisched.cli.main import build_parser
from aisched.spec.errors import SpecError
from aisched.spec.pipeline import parse_submission_document, parse_submission_text

SOURCE = "job.yaml"


def _refused(text: str) -> SpecError | None:
    """The error of reading `text` as a job file, None if it is a valid one; any other
    exception fails the test."""
    try:
        parse_submission_text(text, SOURCE)
    except SpecError as e:
        assert e.problems, "a SpecError without a problem"
        for line in e.problems:
            assert line.startswith(SOURCE), f"a problem that does not name the file: {line!r}"
        return e
    return None


@SETTINGS
@given(m=mutated(), flow=st.booleans())
def test_a_bad_job_file_is_refused_at_its_field(m: Mutation, flow: bool) -> None:
    if m.depth:  # JSON is YAML too
        deep = "[" * m.depth + "1" + "]" * m.depth
        text = json.dumps(m.doc).replace(json.dumps(DEEP), deep)
    else:
        text = yaml.safe_dump(m.doc, allow_unicode=True, default_flow_style=flow)
    e = _refused(text)
    if e is None:
        assert not m.invalid, "an invalid job was taken"
        return
    said = "\n".join(e.problems)
    assert any(n in said for n in m.names.split("|")), f"{m.names!r} not in {said[:2000]!r}"


# YAML's own pieces, put together at random: syntax errors, tags, anchors, odd scalars.
_TOKENS = st.sampled_from(
    [
        "command: ",
        "tasks:",
        "- ",
        "  ",
        "\n",
        ": ",
        "[",
        "]",
        "{",
        "}",
        ",",
        "&a ",
        "*a",
        "*b",
        "!!int ",
        "!!float ",
        "!!timestamp ",
        "!!binary ",
        "!!set ",
        "!!omap ",
        "!!python/name:os.system ",
        "!custom ",
        "? ",
        "<<: ",
        "---\n",
        "...\n",
        "%YAML 1.1\n",
        "|\n",
        ">-\n",
        "'",
        '"',
        "\\",
        "\t",
        "\x00",
        "\ufeff",
        "\x85",
        "\u2028",
        "#",
        "name",
        "x",
        "1e999",
        ".nan",
        "-.inf",
        "0x1F",
        "0o17",
        "1_000",
        "~",
        "null",
        "yes",
        "2001-12-14t21:59:43.10-05:00",
        "jobs:",
        "depends_on: ",
        "resources: {gpus: ",
        "mem: ",
    ]
)


@SETTINGS
@given(text=st.lists(_TOKENS, max_size=25).map("".join))
def test_broken_yaml_is_one_clear_error(text: str) -> None:
    _refused(text)


@SETTINGS
@given(text=st.text(max_size=200))
def test_any_text_is_a_job_or_a_clear_error(text: str) -> None:
    _refused(text)


# --- aisched run --------------------------------------------------------------------------

_FLAG_VALUE = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["0", "-1", "nan", "inf", "-inf", "1e999", "12Q", "0.0001", "1e-9", "99999999999999999"]
    ),
    st.integers(-(2**40), 2**40).map(str),
    st.floats().map(str),
)
_VALUE_FLAGS = [
    "--gpus",
    "--cpus",
    "--mem",
    "--gpu-mem",
    "--replicas",
    "--min-available",
    "--name",
    "--queue",
    "--priority",
    "--max-retries",
    "--time-limit",
    "--estimate",
    "--grace-period",
    "--workdir",
    "--image",
    "--bandwidth",
    "--shm-size",
    "--env",
]


def _run_args(argv: list[str]) -> argparse.Namespace | None:
    """The parsed `aisched run` flags, or None where argparse refuses them (its own one-line
    error, exit status 2)."""
    try:
        return build_parser(["run"]).parse_args(["run", *argv])
    except SystemExit as e:
        assert e.code == 2
        return None


@SETTINGS
@given(
    flags=st.lists(st.tuples(st.sampled_from(_VALUE_FLAGS), _FLAG_VALUE), max_size=4),
    command=st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=3),
)
def test_bad_run_flags_are_one_clear_error(
    flags: list[tuple[str, str]], command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [f"{flag}={value}" for flag, value in flags]
    args = _run_args([*argv, "--", *command])
    if args is None:
        capsys.readouterr()
        return
    try:
        doc = run_document(args)
    except CLIError as e:
        assert str(e) and e.status == 2
        return
    try:
        parse_submission_document(doc, "aisched run")
    except SpecError as e:
        assert all(line.startswith("aisched run: ") for line in e.problems), e.problems


@SETTINGS
@given(value=BAD_VALUES)
def test_a_wrong_type_anywhere_in_a_pipeline_is_named(value: Any) -> None:
    doc = {"jobs": [{"name": "a", "command": "true"}, {"name": "b", "depends_on": value}]}
    try:
        parse_submission_document(doc, SOURCE)
    except SpecError as e:
        assert all(line.startswith(SOURCE) for line in e.problems), e.problems
