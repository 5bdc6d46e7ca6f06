"""Human and machine renderings of `PolicyMetrics`: rich tables side by side, and JSON.

Tables only format; every figure comes from `aisched.sim.metrics`. Units are chosen for reading:
times in hours with two decimals (queueing delay too, since Philly waits run to hours),
utilisation as a percentage. A figure that does not exist (no finished job) shows as "-".
Names come from the input (a trace's VCs, a policy file's `name`) and may hold control
characters: the caller says how one becomes a cell (`label`; the CLI's escapes them), so that
they never reach a terminal as they are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from aisched.sim.metrics import PolicyMetrics, QueueMetrics


def _hours(v: float | None) -> str:
    return "-" if v is None else f"{v / 3600.0:.2f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100.0 * v:.1f}%"


def _int(v: int) -> str:
    return f"{v:,}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _num(v: float) -> str:
    return f"{v:,.1f}"


METRIC_ROWS: tuple[tuple[str, Callable[[PolicyMetrics], str]], ...] = (
    ("jobs submitted", lambda m: _int(m.jobs_submitted)),
    ("jobs finished", lambda m: _int(m.jobs_finished)),
    ("jobs rejected (never fit)", lambda m: _int(m.jobs_rejected)),
    ("jobs unfinished", lambda m: _int(m.jobs_unfinished)),
    ("avg JCT (h)", lambda m: _hours(m.avg_jct_s)),
    ("median JCT (h)", lambda m: _hours(m.median_jct_s)),
    ("p95 JCT (h)", lambda m: _hours(m.p95_jct_s)),
    ("p99 JCT (h)", lambda m: _hours(m.p99_jct_s)),
    ("node-hours", lambda m: _num(m.node_hours)),
    ("cost", lambda m: "-" if m.cost is None else _num(m.cost)),
    ("peak nodes", lambda m: _int(m.peak_nodes)),
    ("nodes added / removed", lambda m: f"{m.nodes_added:,} / {m.nodes_removed:,}"),
    ("avg queueing delay (h)", lambda m: _hours(m.avg_queueing_s)),
    ("median queueing delay (h)", lambda m: _hours(m.median_queueing_s)),
    ("makespan (h)", lambda m: _hours(m.makespan_s)),
    ("GPU utilisation", lambda m: _pct(m.gpu_utilisation)),
    ("GPU-hours used", lambda m: _num(m.gpu_hours)),
    ("preemptions", lambda m: _int(m.preemptions)),
    ("restarts", lambda m: _int(m.restarts)),
    ("runtime estimate: median abs. error (h)", lambda m: _hours(m.estimate_mdae_s)),
    ("runtime estimate: median ratio", lambda m: _ratio(m.estimate_median_ratio)),
    ("runtime estimate: true <= upper", lambda m: _pct(m.estimate_under_upper)),
    ("ETA: jobs with one", lambda m: _int(m.eta_jobs) if m.eta_jobs else "-"),
    ("ETA: median abs. error (h)", lambda m: _hours(m.eta_mdae_s)),
    ("ETA: started within 1 h of it", lambda m: _pct(m.eta_within_1h)),
    ("scheduling cycles", lambda m: _int(m.cycles)),
    ("wall time (s)", lambda m: f"{m.wall_s:.1f}"),
)
# Rows that depend on the machine and its load, not on the input: everything else is the same
# for the same input (the simulator is deterministic). The HTML report marks them.
MACHINE_DEPENDENT_ROWS = frozenset({"wall time (s)"})


def metrics_table(
    results: Sequence[PolicyMetrics], label: Callable[[str], Text], title: str | None = None
) -> Table:
    """Policies as columns, figures as rows; `label` makes a policy's name a header."""
    table = Table(title=title)
    table.add_column("metric", style="bold", no_wrap=True)
    for m in results:
        table.add_column(label(m.policy), justify="right", no_wrap=True)
    for row, fmt in METRIC_ROWS:
        table.add_row(row, *(fmt(m) for m in results))
    return table


_QUEUE_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("queue", "left"),
    ("policy", "left"),
    ("jobs", "right"),
    ("finished", "right"),
    ("avg JCT (h)", "right"),
    ("avg queueing (h)", "right"),
    ("GPU-hours", "right"),
)


def queue_table(
    results: Sequence[PolicyMetrics], label: Callable[[str], Text], title: str | None = None
) -> Table:
    """One section per queue, one row per policy in it; `label` makes a name a cell."""
    table = Table(title=title)
    for name, justify in _QUEUE_COLUMNS:
        table.add_column(name, justify=justify)
    per_policy = [{q.queue: q for q in m.queues} for m in results]
    names = sorted({q for qs in per_policy for q in qs})
    for qi, name in enumerate(names):
        for pi, (m, qs) in enumerate(zip(results, per_policy, strict=True)):
            q = qs.get(name, QueueMetrics(name, 0, 0, None, None, 0.0))
            table.add_row(
                label(name if pi == 0 else ""),
                label(m.policy),
                _int(q.jobs),
                _int(q.finished),
                _hours(q.avg_jct_s),
                _hours(q.avg_queueing_s),
                _num(q.gpu_hours),
                end_section=pi == len(results) - 1 and qi < len(names) - 1,
            )
    return table


def to_json(
    results: Sequence[PolicyMetrics], meta: Mapping[str, object] | None = None
) -> dict[str, object]:
    """`meta` (what was run: trace, cluster, config) goes first, then one entry per policy."""
    doc = {**(meta or {}), "results": [m.to_dict() for m in results]}
    return {k: _plain(v) for k, v in doc.items()}


def _plain(v: object) -> object:
    """JSON has no infinity (an endless checkpoint interval, say): write it as a string."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def write_json(
    path: Path | str, results: Sequence[PolicyMetrics], meta: Mapping[str, object] | None = None
) -> None:
    """Write the figures of every policy to `path` as one JSON document."""
    text = json.dumps(to_json(results, meta), indent=2, allow_nan=False)
    Path(path).write_text(text + "\n", encoding="utf-8")
