"""The tag in the names of a state directory's task cgroups and containers: kept in the
directory, new for a new directory, the path's hash for one made before the tag file was."""

from __future__ import annotations

import hashlib
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aisched.executors.instance import TAG_FILE, InstanceTagError, instance_tag


def test_a_directory_keeps_its_tag_and_a_new_one_gets_another(tmp_path: Path) -> None:
    state = tmp_path / "tasks"
    state.mkdir()
    first = instance_tag(state)
    assert instance_tag(state) == first
    assert (state / TAG_FILE).read_text() == first + "\n"
    assert [p.name for p in state.iterdir()] == [TAG_FILE]  # no draft left behind
    shutil.rmtree(state)
    state.mkdir()
    assert instance_tag(state) != first


def test_executors_starting_together_agree_on_one_tag(tmp_path: Path) -> None:
    state = tmp_path / "tasks"
    state.mkdir()
    with ThreadPoolExecutor(8) as pool:
        tags = set(pool.map(lambda _: instance_tag(state), range(32)))
    assert tags == {(state / TAG_FILE).read_text().strip()}


def test_a_directory_that_holds_tasks_from_before_the_tag_file_keeps_its_paths_hash(
    tmp_path: Path,
) -> None:
    """Its running tasks' cgroups and containers were named so: still found as its own."""
    state = tmp_path / "tasks"
    (state / "17" / "1" / "main-0").mkdir(parents=True)
    assert instance_tag(state) == hashlib.sha256(str(state).encode()).hexdigest()[:10]


@pytest.mark.parametrize("text", ["", "xyz", "0123456789abcdef", "../../etc"])
def test_a_tag_file_that_holds_no_tag_is_refused_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / TAG_FILE).write_text(text)
    with pytest.raises(InstanceTagError) as err:
        instance_tag(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / TAG_FILE}: expected the instance tag")


def test_a_tag_that_cannot_be_made_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / TAG_FILE).mkdir()  # not a file
    with pytest.raises(InstanceTagError) as err:
        instance_tag(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / TAG_FILE}: cannot read or make the instance")
