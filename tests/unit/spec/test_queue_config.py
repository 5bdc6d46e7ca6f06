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
