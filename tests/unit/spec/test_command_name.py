"""A job's default name (`spec.command_name`): the program's base name, never a piece of a
variable the command sets nor of its arguments, in every form a command takes (an argv, one
string meant for a shell, a `sh -c` string); `job` where it cannot be told safely."""

from __future__ import annotations

import pytest

from aisched.spec.command_name import name_from_command


def sh(script: str) -> tuple[str, ...]:
    """A job file's string command, as the spec stores it."""
    return ("/bin/sh", "-c", script)


CASES: list[tuple[str, tuple[str, ...], str]] = [
    ("an argv", ("python", "train.py"), "python"),
    ("a path", ("/usr/bin/python3.11", "x.py"), "python3.11"),
    ("a shell string", sh("python x.py > out.txt"), "python"),
    # One string given as the whole command (`aisched run 'HF_TOKEN=x python3 t.py'`).
    ("one string setting a variable", ("HF_TOKEN=hf_secret123 python3 t.py",), "python3"),
    ("a plain setting", sh("HF_TOKEN=hf_secret A=1 /opt/bin/train --x"), "train"),
    ("a double-quoted value", sh('HF_TOKEN="hf_abc hf_secretpart" python3 -c pass'), "python3"),
    ("a single-quoted value", ("sh", "-c", "PASS='p1 p2secret' true"), "true"),
    ("an escaped space", sh("PASS=p1\\ p2secret true"), "true"),
    ("an ANSI-C quoted value", sh("PASS=$'p1 p2secret' true"), "true"),
    ("a value in one string", ("PASS='p1 p2secret' ./train",), "train"),
    ("env in an argv", ("env", "HF_TOKEN=hf_secret", "python", "t.py"), "python"),
    ("env with options", ("/usr/bin/env", "-i", "-u", "X", "A=b c", "python"), "python"),
    ("env in a shell string", sh("env PASS='p1 p2secret' python t.py"), "python"),
    ("exec env", sh("exec env A=b python"), "python"),
    ("export then the command", sh("export PASS='p1 p2secret'; python t.py"), "python"),
    ("export on its own line", sh("export PASS='p1 p2secret'\npython t.py"), "python"),
    ("a setting then &&", sh("PASS='p1 p2secret' && python t.py"), "python"),
    ("set -e first", sh("set -euo pipefail; TOKEN='a b' ./train.sh --x"), "train.sh"),
    ("bash -lc", ("bash", "-lc", "PASS='p1 p2secret' python"), "python"),
    ("bash -o pipefail -c", ("bash", "-o", "pipefail", "-c", "A='x y' python"), "python"),
    ("sh -c inside sh -c", sh("A='x y' bash -c \"B='p1 p2secret' prog\""), "prog"),
    ("a redirection first", sh("2>/dev/null PASS='p1 p2secret' python"), "python"),
    ("a pipeline", ('echo "x y" | tr a-z A-Z',), "echo"),
    # Arguments never name the job: only the program does.
    ("a token option", ("python", "t.py", "--token=xyz"), "python"),
    ("a password option", sh("./client --password 'p1 p2secret'"), "client"),
    # Where the words cannot be read safely, a generic name.
    ("only settings", sh("HF_TOKEN=hf_secret"), "job"),
    ("only a setting, as argv", ("HF_TOKEN=hf_secret",), "job"),
    ("an unclosed quote", sh("PASS='p1 p2secret python"), "job"),
    ("command substitution", sh("PASS=$(cat p1 p2secret) python"), "job"),
    ("a default with a space", sh("PASS=${X:-p1 p2secret} python"), "job"),
    ("backquotes", sh("PASS=`echo p1 p2secret` python"), "job"),
    ("env -S", sh("env -S 'PASS=p2secret python'"), "job"),
    ("a program word holding =", ("1PASS=p2secret",), "job"),
    ("made a valid name", ("./run!.sh",), "run-.sh"),
]


@pytest.mark.parametrize(("command", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_name_from_command(command: tuple[str, ...], want: str) -> None:
    assert name_from_command(command) == want


@pytest.mark.parametrize("command", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_no_secret_in_any_name(command: tuple[str, ...]) -> None:
    name = name_from_command(command)
    assert not any(s in name.lower() for s in ("secret", "hf_", "p1", "p2", "xyz", "token"))
