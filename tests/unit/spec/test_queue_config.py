"""A queue's `user_limit` in the service config: read in the units of `limit`, refused with
the field's path when it is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from aisched.model.resources import Dim, Resources
from aisched.service.config import load_config
from aisched.spec import SpecError


def test_a_queues_user_limit_is_read_in_the_units_of_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "queues:\n  - name: team\n    limit: {gpus: 8}\n"
        "    user_limit: {gpus: 2, cpus: 4, mem: 16G}\n"
    )
    team = load_config(path).queue_tree().get("team")
    assert team.user_limit == Resources(milli_cpu=4000, mem_mib=16 * 1024, gpu=2)
    assert team.limit == Resources(gpu=8)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("user_limit: {gpus: -1}", "queues.0.user_limit.gpus"),
        ("user_limit: {gpu: 2}", "queues.0.user_limit.gpu: unknown key"),
        ("user_limit: {mem: lots}", "queues.0.user_limit.mem"),
        ("user_limit: 2", "queues.0.user_limit"),
    ],
)
def test_a_bad_user_limit_is_refused_naming_the_field(
    tmp_path: Path, entry: str, message: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"queues:\n  - name: team\n    {entry}\n")
    with pytest.raises(SpecError) as err:
        load_config(path)
    assert message in str(err.value)


def test_a_limit_caps_the_resources_it_names_a_0_among_them(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "queues:\n  - name: cpu-only\n    limit: {gpus: 0}\n"
        "  - name: team\n    limit: {gpus: 4, mem: 64G}\n    user_limit: {cpus: 0}\n"
    )
    tree = load_config(path).queue_tree()
    assert tree.get("cpu-only").limit_caps() == frozenset({Dim.GPU})
    assert tree.get("team").limit_caps() == frozenset({Dim.GPU, Dim.MEMORY})
    assert tree.get("team").user_limit_caps() == frozenset({Dim.CPU})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "borrowing: false",
            "config.yaml: queues: queue team: borrowing: false keeps it within its guarantee, "
            "and it has none, so it could run nothing; give it a guarantee, or cap it with a "
            "limit instead (limit: {gpus: 0} keeps it off GPUs)",
        ),
        (
            "guarantee: {gpus: 4}\n    limit: {gpus: 2}",
            "config.yaml: queues: queue team: limit.gpus (2) is below guarantee.gpus (4): the "
            "queue could never hold what it is guaranteed",
        ),
        (
            "guarantee: {gpus: 1, mem: 32G}\n    limit: {gpus: 2, mem: 16G}",
            "config.yaml: queues: queue team: limit.mem (16 GiB) is below guarantee.mem "
            "(32 GiB): the queue could never hold what it is guaranteed",
        ),
        (
            "guarantee: {cpus: 8}\n    limit: {cpus: 0}",
            "config.yaml: queues: queue team: limit.cpus (0) is below guarantee.cpus (8): the "
            "queue could never hold what it is guaranteed",
        ),
    ],
)
def test_caps_that_contradict_the_guarantee_are_refused(
    tmp_path: Path, entry: str, message: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"queues:\n  - name: team\n    {entry}\n")
    with pytest.raises(SpecError) as err:
        load_config(path)
    assert str(err.value).endswith(message)


def test_a_limit_above_the_guarantee_or_on_another_resource_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "queues:\n  - name: team\n    guarantee: {gpus: 4}\n    limit: {gpus: 4, cpus: 64}\n"
        "    borrowing: false\n"
    )
    team = load_config(path).queue_tree().get("team")
    assert team.limit_caps() == frozenset({Dim.GPU, Dim.CPU})
    assert team.limit == Resources(milli_cpu=64_000, gpu=4)
