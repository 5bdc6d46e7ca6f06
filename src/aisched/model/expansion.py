"""Kubernetes' dependent-variable expansion, `$(NAME)`, as the kubelet does it for a
container's command, args and env values (its `third_party/forked/golang/expansion`).

Rules: `$(NAME)` becomes the value of NAME when it is defined and stays as written when it is
not; `$$` becomes `$` (so `$$(NAME)` gives the literal `$(NAME)`); a `$` before anything else,
and an unclosed `$(`, stay as written. Nothing else is expanded: `$NAME` and `${NAME}` are the
shell's business. Pure: no environment is read here, the caller says what is defined.
"""

from __future__ import annotations

from collections.abc import Mapping


def expand(text: str, defined: Mapping[str, str]) -> str:
    """`text` with every `$(NAME)` of `defined` replaced, and `$$` made `$`."""
    if "$" not in text:
        return text
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "$" or i + 1 == n:
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:  # unclosed: the rest as written
                out.append(text[i:])
                break
            name = text[i + 2 : close]
            out.append(defined[name] if name in defined else text[i : close + 1])
            i = close + 1
        else:
            out.append(c + nxt)
            i += 2
    return "".join(out)


def expand_env(env: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """A container's env list with each value expanded against the variables listed before
    it (Kubernetes' rule: a later or undefined name stays as written)."""
    defined: dict[str, str] = {}
    out: list[tuple[str, str]] = []
    for name, value in env:
        value = expand(value, defined)
        defined[name] = value
        out.append((name, value))
    return tuple(out)
