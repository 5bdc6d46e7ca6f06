"""`aisched run`'s command: words are run as given; one word that is a command line meant for
a shell is sent as a string (run with /bin/sh -c, as a job file's string `command`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aisched.cli.jobs import run_document
from aisched.cli.main import build_parser


def _command(*argv: str) -> object:
    args = build_parser(["run", *argv]).parse_args(["run", *argv])
    return run_document(args)["command"]


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (("--", "python", "t.py"), ["python", "t.py"]),
        (("--", "./train.sh"), ["./train.sh"]),
        (("python3",), ["python3"]),
        # Several words: no shell, whatever they hold.
        (("--", "echo", "a b", "|", "$HOME"), ["echo", "a b", "|", "$HOME"]),
        (('echo "x y" | tr a-z A-Z',), 'echo "x y" | tr a-z A-Z'),
        (("--", "HF_TOKEN=hf_secret123 python3 t.py"), "HF_TOKEN=hf_secret123 python3 t.py"),
        (("--", "~/bin/train"), "~/bin/train"),
    ],
)
def test_one_word_meant_for_a_shell_is_sent_as_a_string(
    argv: tuple[str, ...], want: object
) -> None:
    assert _command(*argv) == want


def test_one_word_naming_a_file_stays_a_program(tmp_path: Path) -> None:
    (tmp_path / "run me.sh").write_text("#!/bin/sh\n")
    assert _command("--workdir", str(tmp_path), "--", "./run me.sh") == ["./run me.sh"]
    assert _command("--workdir", str(tmp_path), "--", "./run you.sh") == "./run you.sh"
