"""The CLI's token file: what it refuses to read, and why it says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from aisched.cli.client import read_token
from aisched.cli.errors import CLIError


@pytest.fixture
def token_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "token"
    monkeypatch.delenv("AISCHED_TOKEN", raising=False)
    monkeypatch.setenv("AISCHED_TOKEN_FILE", str(path))
    return path


def test_a_private_token_file_is_read_without_its_newline(token_file: Path) -> None:
    token_file.write_text("secret\n")
    token_file.chmod(0o600)
    assert read_token() == "secret"


def test_a_token_file_others_may_read_is_refused(token_file: Path) -> None:
    token_file.write_text("secret\n")
    token_file.chmod(0o644)
    with pytest.raises(CLIError, match="readable by others; make it private: chmod 600"):
        read_token()


def test_a_token_file_that_is_not_utf8_is_refused_naming_it(token_file: Path) -> None:
    token_file.write_bytes(b"\xff\xfe")
    token_file.chmod(0o600)
    with pytest.raises(CLIError) as info:
        read_token()
    assert str(info.value) == f"{token_file}: not UTF-8 text"
