"""A policy's constants (strict order, per-job placement, ...) are derived once, when it is
built, and again for a copy made with `dataclasses.replace`."""

from __future__ import annotations

from dataclasses import replace

from aisched.core.policy import preset, with_eta


def _constants(name: str) -> tuple[bool, bool, bool, bool, str | None]:
    p = preset(name)
    chooser = p.gpu_chooser
    return (
        p.fair_users,
        p.strict_order,
        p.per_job_placement,
        p.locality,
        None if chooser is None else chooser.name,
    )


def test_constants_of_the_presets() -> None:
    assert {n: _constants(n) for n in ("fifo", "fifo-backfill", "drf", "random", "fgd")} == {
        "fifo": (False, False, False, True, None),
        "fifo-backfill": (False, True, False, True, None),
        "drf": (True, False, False, True, None),
        "random": (False, False, True, False, "random"),
        "fgd": (False, False, False, False, "fgd"),
    }


def test_a_replaced_policy_derives_its_constants_again() -> None:
    fifo = preset("fifo")
    spread = replace(fifo, scores=preset("random").scores, actions=preset("qssf-backfill").actions)
    assert (spread.per_job_placement, spread.strict_order, spread.locality) == (True, True, False)
    assert with_eta(fifo).strict_order is False
    assert fifo == preset("fifo")
