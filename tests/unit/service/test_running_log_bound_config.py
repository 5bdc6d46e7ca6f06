"""`limits.user_max_running_log_bytes` in a config file: a size, or a share of the data
directory's disk (the default, a quarter); anything else is refused naming the file and key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from aisched.service.config import load_config
from aisched.spec.errors import SpecError


def bound(tmp_path: Path, text: str | None) -> int:
    config = tmp_path / "config.yaml"
    config.write_text("" if text is None else f"limits: {{user_max_running_log_bytes: {text}}}\n")
    return load_config(config).limits.user_max_running_log_bytes_(tmp_path)


def test_the_default_is_a_quarter_of_the_data_directorys_disk(tmp_path: Path) -> None:
    assert bound(tmp_path, None) == shutil.disk_usage(tmp_path).total // 4


@pytest.mark.parametrize(("text", "want"), [("50G", 50 * 2**30), ("0", 0), ("512Mi", 2**29)])
def test_a_size_is_taken_as_it_is(tmp_path: Path, text: str, want: int) -> None:
    assert bound(tmp_path, text) == want


def test_a_share_is_of_the_disk(tmp_path: Path) -> None:
    assert bound(tmp_path, "'10%'") == int(shutil.disk_usage(tmp_path).total * 0.1)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("'150%'", "at most 100 %"),
        ("'0%'", "above 0 %"),
        ("'x%'", "not a percentage"),
        ("lots", "not a size"),
    ],
)
def test_anything_else_is_refused_naming_the_key(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(SpecError, match="user_max_running_log_bytes") as got:
        bound(tmp_path, text)
    assert says in str(got.value)
