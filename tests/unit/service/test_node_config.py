"""The `node` section of the service config: the keys that describe its GPUs are refused, with
the key named, when they are wrong or describe no GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aisched.executors import discovery
from aisched.service.app import Service, ServiceError
from aisched.service.config import load_config
from aisched.spec.errors import SpecError


def problems(tmp_path: Path, node: str) -> list[str]:
    config = tmp_path / "config.yaml"
    config.write_text(f"node: {node}\n")
    with pytest.raises(SpecError) as err:
        load_config(config)
    return [line.removeprefix(f"{config}: ") for line in err.value.problems]


@pytest.mark.parametrize(
    ("node", "want"),
    [
        # Taken, while a job's `gpu_mem: 0` was refused: GPUs of no memory hold no task.
        ("{gpus: 2, gpu_mem: 0}", "node.gpu_mem: must be more than 0"),
        ("{gpus: 2, gpu_mem: 0G}", "node.gpu_mem: must be more than 0"),
        # Taken and ignored: the node had no GPU to name or size.
        (
            "{gpus: 0, gpu_model: A100}",
            "node.gpu_model: names the model of the node's GPUs, but gpus is 0 (none): leave "
            "it out, or declare the GPUs",
        ),
        (
            "{gpus: 0, gpu_mem: 80G}",
            "node.gpu_mem: gives the memory of each of the node's GPUs, but gpus is 0 (none): "
            "leave it out, or declare the GPUs",
        ),
        # pydantic's "Input should be a valid string"; now as a job's gpu_models say it.
        (
            "{gpus: 2, gpu_model: 1}",
            "node.gpu_model: expected a GPU model name such as A100 or H100-80GB, got 1 (an "
            "integer)",
        ),
        (
            "{gpus: 2, gpu_model: 'a b'}",
            "node.gpu_model: 'a b' is not a GPU model name such as A100 or H100-80GB",
        ),
    ],
)
def test_a_wrong_gpu_key_is_refused_naming_it(tmp_path: Path, node: str, want: str) -> None:
    assert problems(tmp_path, node) == [want]


def test_a_flag_that_describes_no_gpu_is_named_by_its_flag(tmp_path: Path) -> None:
    overrides: dict[str, Any] = {
        "data_dir": str(tmp_path),
        "node": {"gpus": 0, "gpu_model": "A100"},
    }
    with pytest.raises(SpecError) as err:
        load_config(None, overrides, flags=True)
    assert err.value.problems == (
        "--gpu-model: names the model of the node's GPUs, but gpus is 0 (none): leave it out, "
        "or declare the GPUs",
    )


def test_gpus_named_and_sized_are_taken(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("node: {gpus: 2, gpu_model: A100, gpu_mem: 80G}\n")
    node = load_config(config).node
    assert (node.gpus, node.gpu_model, node.gpu_mem) == (2, "A100", "80G")


@pytest.mark.parametrize(
    ("file", "flags", "want"),
    [
        (
            None,
            {"gpu_model": "A100"},
            "--gpu-model: describes the node's GPUs, but it has none (NVML finds no GPU on this "
            "machine and --gpus declares none): declare them (--gpus N), or leave --gpu-model "
            "out",
        ),
        (
            "node: {gpu_mem: 16G}\n",
            {},
            "{file}: node.gpu_mem: describes the node's GPUs, but it has none (NVML finds no GPU "
            "on this machine and node.gpus declares none): declare them (node.gpus: N), or "
            "leave node.gpu_mem out",
        ),
        (
            "node: {gpu_mem: 16G}\n",
            {"gpu_model": "A100"},
            "--gpu-model and node.gpu_mem: describe the node's GPUs, but it has none (NVML "
            "finds no GPU on this machine and node.gpus declares none): declare them "
            "(node.gpus: N), or leave --gpu-model and node.gpu_mem out",
        ),
    ],
)
def test_what_discovery_refuses_is_named_as_the_user_gave_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    file: str | None,
    flags: dict[str, Any],
    want: str,
) -> None:
    """Discovery named them by its own arguments (`gpu_model: ...`, `gpu_mem: ...`), where
    every other problem with the config says `--gpu-model: ...` or `FILE: node.gpu_model: ...`."""
    monkeypatch.setattr(discovery, "_pynvml", lambda: None)  # a machine without NVML
    path = None
    if file is not None:
        path = tmp_path / "config.yaml"
        path.write_text(file)
    overrides = {"data_dir": str(tmp_path / "home"), "node": flags}
    cfg = load_config(path, overrides, flags=True)
    with pytest.raises(ServiceError) as err:
        Service.open(cfg).close()
    assert str(err.value) == want.format(file=path)
