"""The simulation report: a self-contained HTML page whose plots come from the run's series."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from aisched.cli.main import main
from aisched.core.policy import load_policy
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.html_report import render_report
from aisched.sim.metrics import compute_metrics
from aisched.sim.series import compute_series
from aisched.sim.traces import synthetic_trace
from aisched.spec.cluster import resolve_cluster

SMALL = ["simulate", "--trace", "synthetic", "--jobs", "60", "--seed", "4", "--no-progress"]
SECTIONS = (
    "job-completion-time",
    "queueing-delay",
    "gpu-utilisation-over-time",
    "waiting-jobs-over-time",
    "allocation-and-arrived-demand",
    "allocation-and-demand-per-queue",
)


def page_for(policies: list[str]) -> str:
    trace = synthetic_trace(60, seed=4)
    cluster = resolve_cluster("small")
    results = [simulate(trace, cluster, load_policy(p), SimConfig()) for p in policies]
    meta = {"trace": trace.name, "jobs": len(trace), "cluster": {"nodes": 8, "gpus": 64}}
    return render_report(
        [compute_metrics(r) for r in results], [compute_series(r) for r in results], meta
    )


def test_every_plot_is_inline_and_nothing_is_fetched() -> None:
    page = page_for(["fifo", "las"])
    for section in SECTIONS:
        block = re.search(rf'<section id="{section}">(.*?)</section>', page, re.S)
        assert block is not None, section
        assert "<svg" in block.group(1), section
    # Namespaces are names, not fetches; no script, no external stylesheet, image or font.
    without_ns = re.sub(r'xmlns(:\w+)?="[^"]*"', "", page)
    assert "http://" not in without_ns and "https://" not in without_ns
    assert "<script" not in page and "<link" not in page and "<img" not in page
    # Text stays text in the SVG, so legends name the policies.
    assert ">fifo<" in page and ">las<" in page
    table = re.search(r'<table id="figures">(.*?)</table>', page, re.S)
    assert table is not None and "avg JCT (h)" in table.group(1)


MACHINE_ROW = re.compile(r'<tr class="machine-dependent">(.*?)</tr>', re.S)


def test_the_same_run_gives_the_same_page_apart_from_the_marked_machine_rows() -> None:
    first, second = page_for(["fifo"]), page_for(["fifo"])
    # Exactly the wall time is marked; its value may differ between runs, nothing else may.
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in MACHINE_ROW.findall(first)]
    assert rows == [["wall time (s)"]]
    assert MACHINE_ROW.sub("", first) == MACHINE_ROW.sub("", second)


def test_simulate_report_writes_index_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "report" / "run1"
    assert main([*SMALL, "--policy", "fifo,drf", "--report", str(folder)]) == 0
    page = (folder / "index.html").read_text()
    assert "synthetic-4" in page and ">drf<" in page
    assert f"report: {folder / 'index.html'}" in capsys.readouterr().out


def test_a_reports_long_path_is_printed_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Wider than the console: rich broke the line after "report:", and so the path read back
    # from the output (under pytest-xdist's longer temporary paths, too).
    folder = tmp_path / ("deep-" * 20) / "run1"
    assert main([*SMALL, "--policy", "fifo", "--report", str(folder)]) == 0
    assert f"report: {folder / 'index.html'}\n" in capsys.readouterr().out


def test_without_matplotlib_it_says_how_to_get_it_before_simulating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert main([*SMALL, "--policy", "fifo", "--report", str(tmp_path / "r")]) == 2
    captured = capsys.readouterr()
    assert "pip install 'aisched[report]'" in captured.err
    assert "avg JCT" not in captured.out  # refused before any simulation ran
    assert not (tmp_path / "r").exists()


def test_an_autoscaled_run_gets_a_nodes_plot_and_a_fixed_one_does_not() -> None:
    from test_cluster_autoscaling import autoscaled, gang, pool
    from test_cluster_autoscaling import run as run_pools

    r = run_pools([gang("j1", 0.0, 1000.0, tasks=2), gang("j2", 5000.0, 500.0)], autoscaled(pool()))
    meta = {"trace": "t", "jobs": 2}
    page = render_report([compute_metrics(r)], [compute_series(r)], meta)
    block = re.search(r'<section id="nodes-over-time">(.*?)</section>', page, re.S)
    assert block is not None and "<svg" in block.group(1)
    assert ">GPUs present<" in page  # the demand plot follows the nodes, not a fixed capacity
    assert 'id="nodes-over-time"' not in page_for(["fifo"])
