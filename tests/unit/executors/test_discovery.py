"""Machine discovery: measured and declared figures, NVML present (a fake), failing or absent;
and the choice of a memory-limit mechanism on a cgroup parent we are given."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from aisched.executors import discovery
from aisched.executors.cgroups import (
    MemoryControl,
    MemoryControlError,
    cgroup_name,
    choose_memory_control,
    create_task_cgroup,
)
from aisched.executors.discovery import DiscoveryError, discover_node, gpu_memory, short_model
from aisched.model.cluster import GPU

CORES = len(os.sched_getaffinity(0))


class FakeNvml:
    """The few NVML calls discovery makes, over a made-up machine; `fail` names the call that
    raises (as a broken driver would)."""

    NVML_P2P_CAPS_INDEX_NVLINK = 4
    NVML_P2P_STATUS_OK = 0

    def __init__(
        self,
        names: list[str | bytes],
        mem_mib: int = 81_559,
        nvlinks: tuple[tuple[int, int], ...] = (),
        fail: str = "",
    ) -> None:
        self.names = names
        self.mem_mib = mem_mib
        self.nvlinks = {frozenset(p) for p in nvlinks}
        self.fail = fail
        self.inits = 0

    def _maybe_fail(self, call: str) -> None:
        if self.fail == call:
            raise RuntimeError(f"{call}: Unknown Error")

    def nvmlInit(self) -> None:
        self._maybe_fail("nvmlInit")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < len(self.names):
            raise RuntimeError("Invalid Argument")
        return i

    def nvmlDeviceGetName(self, h: int) -> str | bytes:
        self._maybe_fail("nvmlDeviceGetName")
        return self.names[h]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=self.mem_mib << 20)

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, cap: int) -> int:
        self._maybe_fail("nvmlDeviceGetP2PStatus")
        assert cap == self.NVML_P2P_CAPS_INDEX_NVLINK
        return 0 if frozenset((a, b)) in self.nvlinks else 1

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        if h == 0:
            return [SimpleNamespace(pid=4242, usedGpuMemory=2 << 30)]
        return [SimpleNamespace(pid=7, usedGpuMemory=None)]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[[FakeNvml | None], None]:
    """Installs a fake NVML (None: the package is missing) for the test."""

    def install(fake: FakeNvml | None) -> None:
        monkeypatch.setattr(discovery, "_pynvml", lambda: fake)
        monkeypatch.setattr(discovery, "_nvml_ready", None)

    return install


H100 = "NVIDIA H100 80GB HBM3"


def test_declared_gpus_make_a_cpu_only_machine_look_like_a_gpu_node(nvml: Callable) -> None:
    nvml(FakeNvml([], fail="nvmlInit"))
    node, notes = discover_node("box", gpus=2, gpu_model="A100", gpu_mem_mib=81_920)
    assert (node.name, node.milli_cpu) == ("box", CORES * 1000)
    assert node.gpus == (GPU(0, "A100", 81_920, 0), GPU(1, "A100", 81_920, 0))
    assert notes[0] == f"cpus: {CORES} usable cores (CPU affinity of the scheduler)"
    assert "gpus: NVML unavailable (nvmlInit: Unknown Error)" in notes
    assert notes[-1] == "gpus: 2 declared (A100), none detected: not checked"


def test_on_this_machine_without_nvml_declared_gpus_are_taken_as_declared() -> None:
    found, _ = discovery.nvml_gpus()
    if found:
        pytest.skip("this machine has GPUs that NVML sees")
    node, notes = discover_node(gpus=3)
    assert node.gpus == tuple(GPU(i, "declared", 0, 0) for i in range(3))
    assert any(n.startswith("gpus: NVML unavailable") for n in notes)
    plain, _ = discover_node()
    assert plain.gpus == ()


def test_a_missing_nvml_package_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    node, notes = discover_node()
    assert node.gpus == ()
    assert "gpus: NVML unavailable (the nvidia-ml-py package is not installed)" in notes
    assert gpu_memory([0]) == {}


def test_real_gpus_come_from_nvml_with_their_nvlink_groups(nvml: Callable) -> None:
    fake = FakeNvml([H100, H100, H100.encode(), H100], nvlinks=((0, 1), (2, 3), (1, 0)))
    nvml(fake)
    node, notes = discover_node("gpu-box")
    assert node.gpus == (
        GPU(0, "H100", 81_559, 0),
        GPU(1, "H100", 81_559, 0),
        GPU(2, "H100", 81_559, 1),
        GPU(3, "H100", 81_559, 1),
    )
    assert "gpus: 4 found by NVML (NVIDIA H100 80GB HBM3)" in notes
    assert "gpus: NVLink groups from NVML peer status: 2" in notes
    assert fake.inits == 0  # shut down again


def test_declared_gpus_keep_the_first_real_ones(nvml: Callable) -> None:
    nvml(FakeNvml([H100] * 4, nvlinks=((0, 1), (1, 2), (2, 3))))
    node, notes = discover_node(gpus=2, gpu_model="H100-SXM", gpu_mem_mib=40_000)
    assert node.gpus == (GPU(0, "H100-SXM", 40_000, 0), GPU(1, "H100-SXM", 40_000, 0))
    assert "gpus: the first 2 of 4 used, as declared" in notes
    assert discover_node(gpus=0)[0].gpus == ()


def test_a_gpu_model_or_size_for_a_node_without_gpus_is_an_error(nvml: Callable) -> None:
    # Ignored, the service started with no GPU, and every GPU job waited for ever.
    nvml(FakeNvml([], fail="nvmlInit"))
    with pytest.raises(DiscoveryError) as err:
        discover_node(gpu_model="A100")
    assert str(err.value) == (
        "gpu_model: describes the node's GPUs, but it has none (NVML finds no GPU on this "
        "machine and gpus declares none): declare them (gpus: N), or leave gpu_model out"
    )
    nvml(FakeNvml([H100] * 2))
    with pytest.raises(DiscoveryError) as err:
        discover_node(gpus=0, gpu_model="A100", gpu_mem_mib=81_920)
    assert str(err.value) == (
        "gpu_model and gpu_mem_mib: describe the node's GPUs, but it has none (gpus is 0): "
        "declare them (gpus: N), or leave gpu_model and gpu_mem_mib out"
    )
    assert err.value.key == "gpu_model"
    assert discover_node(gpus=0)[0].gpus == ()  # no GPU, none described: as before


def test_declaring_more_gpus_than_present_is_an_error(nvml: Callable) -> None:
    nvml(FakeNvml([H100]))
    with pytest.raises(DiscoveryError) as err:
        discover_node(gpus=2)
    assert str(err.value) == "gpus: 2 declared, but this machine has only 1 GPU (NVML)"
    # Named as the caller says (the service: as the user gave it).
    with pytest.raises(DiscoveryError) as err:
        discover_node(gpus=2, names={"gpus": "node.gpus"})
    assert str(err.value) == "node.gpus: 2 declared, but this machine has only 1 GPU (NVML)"
    assert err.value.key == "gpus"


@pytest.mark.parametrize(
    ("fail", "gpus", "note"),
    [
        ("nvmlInit", (), "gpus: NVML unavailable (nvmlInit: Unknown Error)"),
        (
            "nvmlDeviceGetName",
            (),
            "gpus: NVML failed while listing devices (nvmlDeviceGetName: Unknown Error)",
        ),
        (
            "nvmlDeviceGetP2PStatus",
            (GPU(0, "H100", 81_559, 0), GPU(1, "H100", 81_559, 0)),
            "gpus: NVLink topology unknown (nvmlDeviceGetP2PStatus: Unknown Error): one group",
        ),
    ],
)
def test_nvml_failures_never_break_discovery(
    nvml: Callable, fail: str, gpus: tuple[GPU, ...], note: str
) -> None:
    nvml(FakeNvml([H100, H100], fail=fail))
    node, notes = discover_node()
    assert node.gpus == gpus
    assert note in notes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus": -1}, "gpus: must be at least 0, got -1"),
        ({"gpus": 1.5}, "gpus: expected a whole number, got 1.5"),
        ({"gpus": "2"}, "gpus: expected a number, got '2'"),
        ({"gpus": True}, "gpus: expected a number, got True"),
        ({"cpus": 0}, "cpus: must be at least 0.001, got 0"),
        ({"mem_mib": 0}, "mem_mib: must be at least 1, got 0"),
        ({"gpu_mem_mib": -5}, "gpu_mem_mib: must be at least 0, got -5"),
        ({"gpu_model": " "}, "gpu_model: expected a non-empty name, got ' '"),
        ({"name": ""}, "name: expected a non-empty node name, got ''"),
    ],
)
def test_bad_declarations_are_refused_naming_the_argument(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(DiscoveryError) as err:
        discover_node(**kwargs)  # type: ignore[arg-type]
    assert str(err.value) == message


def test_declared_cpus_and_memory_override_with_a_note(nvml: Callable) -> None:
    nvml(None)
    measured, _ = discover_node()
    fewer, notes = discover_node(cpus=0.5, mem_mib=100)
    assert (fewer.milli_cpu, fewer.mem_mib) == (500, 100)
    assert {"cpus: 0.5 declared", "memory: 100 MiB declared"} <= set(notes)
    more, notes = discover_node(cpus=CORES + 1, mem_mib=measured.mem_mib + 1)
    assert (more.milli_cpu, more.mem_mib) == ((CORES + 1) * 1000, measured.mem_mib + 1)
    assert f"cpus: {CORES + 1} declared, more than {CORES} usable cores: tasks share them" in notes
    assert (
        f"memory: {measured.mem_mib + 1} MiB declared, more than the {measured.mem_mib} MiB present"
        in notes
    )


def test_the_node_is_named_after_the_host_by_default(nvml: Callable) -> None:
    nvml(None)
    assert discover_node()[0].name == os.uname().nodename


def test_gpu_memory_lists_processes_per_gpu(nvml: Callable) -> None:
    nvml(FakeNvml([H100, H100]))
    assert gpu_memory([0, 1, 9]) == {0: [(4242, 2048)], 1: [(7, 0)]}
    nvml(FakeNvml([H100], fail="nvmlInit"))
    assert gpu_memory([0]) == {}


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA", "NVIDIA"),
    ],
)
def test_short_model_names(name: str, model: str) -> None:
    assert short_model(name) == model


# --- memory mechanisms on a cgroup parent we are given ---------------------------------------


def fake_cgroup(path: Path, files: dict[str, str]) -> str:
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return str(path)


def test_cgroup_v2_needs_the_memory_controller(tmp_path: Path) -> None:
    parent = fake_cgroup(tmp_path / "cg", {"cgroup.controllers": "cpu io\n"})
    with pytest.raises(MemoryControlError) as err:
        choose_memory_control("cgroup-v2", cgroup_parent=parent)
    assert str(err.value) == (
        f"memory mechanism cgroup-v2 is not available: the memory controller is not available"
        f" in {parent}"
    )


@pytest.mark.parametrize(
    ("mechanism", "want"),
    [
        (
            "cgroup-v2",
            {"memory.max": str(512 << 20), "memory.swap.max": "0", "memory.oom.group": "1"},
        ),
        (
            "cgroup-v1",
            {
                "memory.limit_in_bytes": str(512 << 20),
                "memory.memsw.limit_in_bytes": str(512 << 20),
            },
        ),
    ],
)
def test_a_task_cgroup_gets_its_limit(tmp_path: Path, mechanism: str, want: dict[str, str]) -> None:
    # A plain directory stands in for the parent cgroup: only the files written are checked.
    ctrl = MemoryControl(mechanism, str(tmp_path))
    path = create_task_cgroup(ctrl, cgroup_name("ab12", "job/1", 0, "w-0"), 512)
    assert path == str(tmp_path / "ab12.job_1.0.w-0")
    assert {p.name: p.read_text() for p in Path(path).iterdir()} == want
    assert create_task_cgroup(MemoryControl("rlimit"), "x", 512) is None


def test_cgroup_v1_needs_a_memory_cgroup(tmp_path: Path) -> None:
    parent = fake_cgroup(tmp_path / "cg", {})
    with pytest.raises(MemoryControlError, match=f"{parent} is not a cgroup v1 memory cgroup"):
        choose_memory_control("cgroup-v1", cgroup_parent=parent)


def test_auto_falls_back_to_an_rlimit_and_says_why(tmp_path: Path) -> None:
    parent = fake_cgroup(tmp_path / "cg", {"cgroup.controllers": ""})
    ctrl = choose_memory_control("auto", cgroup_parent=parent)
    assert ctrl.mechanism == "rlimit"
    assert ctrl.notes[1:] == (
        f"cgroup-v2: the memory controller is not available in {parent}",
        f"cgroup-v1: {parent} is not a cgroup v1 memory cgroup",
    )
