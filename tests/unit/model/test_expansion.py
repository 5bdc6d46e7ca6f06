"""Kubernetes' `$(NAME)` expansion, on the kubelet's own cases (`expansion/expand_test.go`)."""

from __future__ import annotations

import pytest

from aisched.model.expansion import expand, expand_env

DEFINED = {"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_EMPTY": "", "VC_TASK_INDEX": "3"}


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("$(VAR_A)", "A"),
        ("___$(VAR_B)___", "___B___"),
        ("$(VAR_A)-$(VAR_A)", "A-A"),
        ("--rank=$(VC_TASK_INDEX)", "--rank=3"),
        ("$(VAR_EMPTY)", ""),
        ("$(VAR_DNE)", "$(VAR_DNE)"),  # undefined: as written
        ("$$(VAR_B)", "$(VAR_B)"),  # escaped: literal
        ("$$$(VAR_A)", "$A"),
        ("$$$$(VAR_A)", "$$(VAR_A)"),
        ("$$", "$"),
        ("f000-$$VAR_A", "f000-$VAR_A"),
        ("$VAR_A", "$VAR_A"),  # the shell's syntax is left to the shell
        ("${VAR_A}", "${VAR_A}"),
        ("$", "$"),
        ("$(VAR_A", "$(VAR_A"),  # unclosed
        ("$()", "$()"),
        ("echo $(VC_TASK_INDEX)", "echo 3"),
        ("no dollar", "no dollar"),
    ],
)
def test_expand(text: str, want: str) -> None:
    assert expand(text, DEFINED) == want


def test_env_values_see_only_the_variables_listed_before_them() -> None:
    env = (("A", "a"), ("B", "$(A)-$(C)"), ("C", "c"), ("D", "$(C)$$(A)"), ("E", "$(B)"))
    assert expand_env(env) == (
        ("A", "a"),
        ("B", "a-$(C)"),  # C comes later: as written
        ("C", "c"),
        ("D", "c$(A)"),
        ("E", "a-$(C)"),  # B as expanded, not expanded again
    )
