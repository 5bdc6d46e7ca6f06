"""The tables of `aisched nodes`, `aisched queues` and `aisched top` at 80 columns (a pipe,
or a terminal that wide), with the values of a real machine: no line is longer, and no cell
is wrapped onto a second line (`22057 / 24105` with `MiB` on the next, as `nodes` printed
once its PINNING column said `cpuset cgroup`)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console, RenderableType

from aisched.cli.cluster import print_nodes, queues_table
from aisched.cli.top import frame

WIDTH = 80


def console(width: int = WIDTH) -> Console:
    return Console(width=width, file=io.StringIO(), record=True, highlight=False)


def lines_of(con: Console) -> list[str]:
    return [line.rstrip() for line in con.export_text().splitlines()]


def assert_fits(lines: list[str], cells: list[str]) -> None:
    """No line is wider than 80 and each cell is whole on one line."""
    assert max(len(line) for line in lines) <= WIDTH, "\n".join(lines)
    for cell in cells:
        assert any(cell in line for line in lines), f"{cell!r} is wrapped:\n" + "\n".join(lines)


def gpu(index: int, job: str | None) -> dict[str, Any]:
    used_by = [] if job is None else [{"job": job, "task": "worker-0", "gpu_milli": 1000}]
    return {
        "index": index,
        "model": "NVIDIA A100-SXM4-80GB",
        "mem_mib": 81920,
        "free_milli": 1000 if job is None else 0,
        "used_by": used_by,
    }


def a_node(name: str, rack: str = "rack-0") -> dict[str, Any]:
    """A 512 GiB, 128-core box with eight GPUs, six of them used (what `/v1/nodes` says)."""
    return {
        "name": name,
        "rack": rack,
        "zone": "zone-0",
        "healthy": True,
        "milli_cpu": 128_000,
        "mem_mib": 515_890,
        "free_milli_cpu": 112_000,
        "free_mem_mib": 498_002,
        "gpus": [gpu(i, "1024" if i < 6 else None) for i in range(8)],
        "memory_limit": "cgroup-v2",
        "cpu_affinity": True,
        "pinning": "cpuset cgroup",
        "notes": [],
    }


@pytest.mark.parametrize("name", ["vm", "gpu-box-01"])
def test_the_nodes_table_of_one_machine_fits_80_columns(name: str) -> None:
    con = console()
    print_nodes([a_node(name)], con)
    lines = lines_of(con)
    assert_fits(
        lines,
        [f"{name}  ", "112 / 128", "498002 / 515890 MiB", "2 / 8", "cgroup-v2", "cpuset cgroup"],
    )
    assert_fits(lines, ["NVIDIA A100-SXM4-80GB", "80 GiB", "job 1024 worker-0"])
    # One rack: no RACK column, which would say the same on every line.
    assert lines[0].split() == [
        *("NODE", "CPUS", "FREE", "MEM", "FREE", "GPUS", "FREE", "MEM", "LIMIT", "PINNING")
    ]


def test_the_nodes_table_names_racks_where_there_are_several() -> None:
    con = console()
    print_nodes([a_node("n1", "r1"), a_node("n2", "r2")], con)
    lines = lines_of(con)
    assert lines[0].split()[:2] == ["NODE", "RACK"]
    assert lines[1].split()[:2] == ["n1", "r1"]


def queue(name: str, used: dict[str, float], **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "parent": None,
        "weight": 1.0,
        "guarantee": {},
        "limit": None,
        "borrowing": True,
        "used": used,
        "pending": 12,
        "running": 4,
    } | more


def test_the_queues_table_of_one_machine_fits_80_columns() -> None:
    busy = {"gpus": 6, "cpus": 16, "mem_gib": 96}
    con = console()
    con.print(queues_table([queue("default", busy)]))
    lines = lines_of(con)
    assert_fits(lines, ["default", "6 GPU, 16 CPU, 96 GiB"])
    # No PARENT or WEIGHT column, which would say `-` and `1` on every line.
    assert lines[0].split() == [
        *("QUEUE", "GUARANTEE", "LIMIT", "PER", "USER", "USED", "PENDING", "RUNNING")
    ]


def test_the_queues_table_shows_parents_and_weights_where_they_say_something() -> None:
    con = console()
    con.print(
        queues_table(
            [
                queue("org", {}, weight=2.0),
                queue("train", {"gpus": 2}, parent="org"),
            ]
        )
    )
    header = lines_of(con)[0].split()
    assert header[:3] == ["QUEUE", "PARENT", "WEIGHT"]


def dashboard(free_mem_gib: float) -> dict[str, Any]:
    """A `/v1/dashboard` document of one machine with eight GPUs."""
    node = {
        "name": "gpu-box-01",
        "zone": "zone-0",
        "healthy": True,
        "cpus": 128.0,
        "free_cpus": 112.0,
        "mem_gib": 515_890 / 1024,
        "free_mem_gib": free_mem_gib,
        "gpus": [
            {"index": i, "state": "used", "users": [{"job": "1024", "gpu_milli": 1000}]}
            for i in range(6)
        ]
        + [{"index": i, "state": "free", "users": []} for i in (6, 7)],
    }
    return {
        "version": "0.1.0",
        "policy": "default",
        "time": 1000.0,
        "summary": {
            "jobs": {"running": 1, "pending": 0},
            "gpus": {"used": 6, "total": 8},
            "cpus": {"used": 16, "total": 128},
            "mem_gib": {"used": 17_888 / 1024, "total": 515_890 / 1024},
        },
        "racks": [{"name": "rack-0", "nodes": [node]}],
        "queues": [],
        "pending": [],
    }


def print_frame(doc: dict[str, Any], width: int = WIDTH) -> list[str]:
    con = console(width)
    view: RenderableType = frame(doc)
    con.print(view)
    return lines_of(con)


def test_top_says_memory_as_every_other_command_does() -> None:
    """In MiB where GiB would need more than two decimals, like `aisched nodes`: it said
    `17.5/503.8` and `486.3/503.8` (GiB, rounded to a tenth). At 80 columns (a terminal that
    wide) the summary line and the row of GPUs wrap between their items, never inside a
    figure; a pipe gets 160."""
    lines = print_frame(dashboard(498_002 / 1024), width=160)
    assert lines[0].endswith("GPUs 6/8  CPUs 16/128  memory 17888 / 515890 MiB")
    assert lines[2].split()[:6] == ["RACK", "NODE", "CPUS", "FREE", "MEM", "FREE"]
    assert lines[3].split()[:6] == ["rack-0", "gpu-box-01", "112/128", "498002", "/", "515890"]
    assert_fits(print_frame(dashboard(498_002 / 1024)), ["498002 / 515890 MiB", "0:1024"])
    # Whole sizes in their largest unit, as describe_mib says them.
    assert "512 GiB / 515890 MiB" in "\n".join(print_frame(dashboard(512.0)))
