"""A job's default name, derived from its command.

Every user sees every job's name, while a job's command is private to its owner and admins
(docs/security.md). So the name is the base name of the program alone, never an argument
(`--token=...`, a script's options) and never any part of a variable the command sets first:
`HF_TOKEN=x python t.py`, `env HF_TOKEN=x python`, `export HF_TOKEN="a b"; python` and
`sh -c "..."` around any of them are all named `python`.

Shell strings are split as a POSIX shell splits words (`shlex`), so quoted values with spaces
stay whole. Where the split cannot be trusted (unbalanced quotes, a value built by command
substitution or `${...}`, nesting too deep) the name is `job`: a generic name is always better
than raw words of the command. Nothing here runs or checks the command.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from aisched.spec.job_common import MAX_NAME_LEN

GENERIC_NAME = "job"

_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")  # a shell word that sets a variable
# A word any shell reads as itself: no spaces, quotes, expansions or operators.
_PLAIN = re.compile(r"[A-Za-z0-9_@%+:,./-]+")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash"})
# Builtins that only set variables or shell options: the command after them names the job.
_SETTERS = frozenset({"export", "readonly", "declare", "typeset", "local", "set", "unset"})
# Prefixes that run the words after them as the command.
_WRAPPERS = frozenset({"env", "exec"})
# Options of `env` (and `exec`) that take a value: `env -u NAME prog`, `env -C DIR prog`.
_ENV_VALUE_OPTIONS = frozenset({"-u", "--unset", "-C", "--chdir", "-a", "--argv0"})
# Operators; a run of them is one token (`;`, `&&`, `|`, newlines, redirections).
_OPERATOR_CHARS = ";&|()<>\n"
_MAX_DEPTH = 4  # `sh -c "bash -c '...'"`: deeper than this is named generically


def name_from_command(command: Sequence[str]) -> str:
    """The base name of the program `command` runs, made a valid job name (1 to 63 of
    letters, digits, '.', '_', '-'), or `job` when that cannot be told safely."""
    program = _program(list(command), 0)
    if program is None:
        return GENERIC_NAME
    base = _base(program)
    if "=" in base:  # never a piece of something that looks like a setting
        return GENERIC_NAME
    clean = _NAME_CHARS.sub("-", base).lstrip("._-")[:MAX_NAME_LEN]
    return clean or GENERIC_NAME


class _Unsure(Exception):
    """The words cannot be read safely: the job gets the generic name."""


def _program(words: list[str], depth: int) -> str | None:
    try:
        return _argv_program(words, depth)
    except _Unsure:
        return None


def _argv_program(words: list[str], depth: int) -> str | None:
    """The program of an argv (as exec runs it), past variables set before it and `env` or
    `exec`; a shell's `-c` string is looked into. None: the words run no program."""
    if depth > _MAX_DEPTH:
        raise _Unsure
    if words and _meant_for_a_shell(words[0]):
        # Spaces, quotes or shell syntax in the program's own word: one string meant for a
        # shell (`["HF_TOKEN=x python t.py"]`). Read it as a shell would: its words after
        # the first are arguments, never part of the name.
        return _shell_program(words[0], depth + 1)
    i = _past_prefixes(words, 0)
    if i >= len(words):
        return None
    word = words[i]
    if _meant_for_a_shell(word):  # `["env", "A=b", "prog x"]`, as above
        return _shell_program(word, depth + 1)
    if _base(word) in _SHELLS:
        script = _shell_script(words[i + 1 :])
        if script is not None:
            return _shell_program(script, depth + 1)
    return word


def _past_prefixes(words: list[str], i: int) -> int:
    """The index of the first word past variable settings and `env`/`exec` (with their
    options and settings)."""
    while i < len(words):
        word = words[i]
        if _ASSIGNMENT.match(word):
            _check_value(word)
            i += 1
        elif _base(word) in _WRAPPERS:
            i += 1
            while i < len(words) and words[i].startswith("-"):
                option = words[i]
                if option.startswith("--split-string") or (
                    not option.startswith("--") and "S" in option
                ):
                    raise _Unsure  # `env -S "A=b prog"`: a string of its own to split
                i += 2 if option in _ENV_VALUE_OPTIONS else 1
        else:
            return i
    return i


def _shell_script(args: list[str]) -> str | None:
    """The string a shell runs for `args` (what follows the shell's name) when they hold
    `-c`, possibly among other options (`-ec`, `-e -c`, `-o pipefail -c`); else None."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-o", "+o"):
            i += 2
            continue
        if len(arg) > 1 and arg[0] in "-+" and arg != "--":
            if arg[0] == "-" and "c" in arg[1:]:
                return args[i + 1] if i + 1 < len(args) else None
            i += 1
            continue
        return None  # a script file or `--`: no -c string
    return None


def _shell_program(script: str, depth: int) -> str | None:
    """The first program a shell string runs, past commands that only set variables
    (`A=b && prog`, `export A=b; prog`, `set -e; prog`)."""
    tokens = _shell_words(script)
    command: list[str] = []
    for token in [*tokens, ";"]:
        if not _is_operator(token):
            command.append(token)
            continue
        if _is_redirection(token):
            command.append(token)  # dropped with its target below
            continue
        program = _simple_command_program(command, depth)
        if program is not None:
            return program
        command = []
    return None


def _simple_command_program(words: list[str], depth: int) -> str | None:
    """The program of one simple command of a shell string, or None when it runs none (it
    only sets variables or shell options, or is empty)."""
    kept: list[str] = []
    skip_next = False
    for n, word in enumerate(words):  # redirections go, with their targets (`>log prog`)
        if skip_next:
            skip_next = False
        elif _is_operator(word):
            skip_next = True
        elif not (word.isdigit() and n + 1 < len(words) and _is_operator(words[n + 1])):
            kept.append(word)  # (not the descriptor of `2>log`)
    i = _past_prefixes(kept, 0)
    if i >= len(kept) or kept[i] in _SETTERS:
        for word in kept[i:]:
            if _ASSIGNMENT.match(word):
                _check_value(word)
        return None
    return _argv_program(kept[i:], depth)


def _shell_words(script: str) -> list[str]:
    """`script` split into words and operators as a POSIX shell splits it (quotes removed,
    comments dropped); _Unsure where it cannot be split."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=_OPERATOR_CHARS)
    lexer.whitespace = " \t\r"  # a newline ends a command, like `;`
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote or escape: the shell itself would refuse it
        raise _Unsure from None


def _check_value(assignment: str) -> None:
    """Raise _Unsure where the shell's word split may have cut a value in two (shlex does not
    know `${X:-a b}`, `$(...)` or backquotes), so a piece of it would be taken for the
    program."""
    value = assignment.partition("=")[2]
    if (
        value.count("`") % 2
        or value.count("{") > value.count("}")
        or value.count("(") > value.count(")")
        or value.endswith("$")
    ):
        raise _Unsure


def _meant_for_a_shell(word: str) -> bool:
    """Whether a shell would read `word` as more than the one word it is (spaces, quotes,
    operators, expansions)."""
    return not _PLAIN.fullmatch(word) and _shell_words(word) != [word]


def _is_operator(token: str) -> bool:
    return bool(token) and all(c in _OPERATOR_CHARS for c in token)


def _is_redirection(token: str) -> bool:
    return ("<" in token or ">" in token) and not any(c in token for c in ";|()\n")


def _base(word: str) -> str:
    return word.rstrip("/").rsplit("/", 1)[-1]
