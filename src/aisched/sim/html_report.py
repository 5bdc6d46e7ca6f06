"""`aisched simulate --report DIR`: one self-contained HTML page with the figures and plots.

Plots are drawn with matplotlib (the optional `report` extra) and embedded as inline SVG, so
the page needs no other file and nothing from the network. It draws, per policy: the JCT CDF,
the queueing-delay CDF, GPU utilisation over time, waiting jobs over time, allocation against
arrived demand, and, with several queues, each queue's allocation against its demand. All of it
comes from `PolicyMetrics` and `PolicySeries`; this module only draws. Output is the same for
the same input (no dates, fixed SVG ids), apart from the figures that depend on the machine
(`MACHINE_DEPENDENT_ROWS`: the wall time), whose rows are marked `class="machine-dependent"`.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from aisched.sim.metrics import PolicyMetrics
from aisched.sim.report import MACHINE_DEPENDENT_ROWS, METRIC_ROWS
from aisched.sim.series import QUANTILES, PolicySeries

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'aisched[report]'"
HOUR = 3600.0


class ReportUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Fail early, before any simulation runs, when the plots cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportUnavailable(
            f"--report draws its plots with matplotlib, which is not installed: {INSTALL_HINT}"
        ) from None


def write_report(
    folder: Path,
    metrics: Sequence[PolicyMetrics],
    series: Sequence[PolicySeries],
    meta: Mapping[str, Any],
) -> Path:
    """Write `folder/index.html` (the folder is created); returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "index.html"
    path.write_text(render_report(metrics, series, meta), encoding="utf-8")
    return path


def render_report(
    metrics: Sequence[PolicyMetrics], series: Sequence[PolicySeries], meta: Mapping[str, Any]
) -> str:
    require_matplotlib()
    plots = [
        ("Job completion time", "CDF over finished jobs, log scale.", _jct_cdf(series)),
        (
            "Queueing delay",
            "Submission to first start, CDF over jobs that started; delays under a second "
            "are drawn at one second.",
            _queueing_cdf(series),
        ),
        (
            "GPU utilisation over time",
            "Allocated GPUs over capacity (with autoscaling pools: over the GPUs of the nodes "
            "present), averaged over each time bin.",
            _utilisation(series),
        ),
        ("Waiting jobs over time", "Jobs pending, averaged over each time bin.", _pending(series)),
        (
            "Allocation and arrived demand",
            "GPUs allocated against the GPUs of every job that has arrived and not finished; "
            "demand above capacity is work waiting.",
            _demand(series),
        ),
    ]
    if any(s.autoscaled for s in series):
        plots.append(
            (
                "Nodes over time",
                "Autoscaling pools: nodes billed (present, or asked for and still provisioning), "
                "averaged over each time bin.",
                _nodes(series),
            )
        )
    if any(s.queues for s in series):
        plots.append(
            (
                "Allocation and demand per queue",
                "The queues with the most GPU-hours; allocation solid, arrived demand dashed.",
                _queues(series),
            )
        )
    title = f"aisched simulation: {meta.get('trace', '')}"
    sections = "\n".join(
        f'<section id="{_slug(name)}"><h2>{html.escape(name)}</h2>'
        f'<p class="note">{html.escape(note)}</p>{svg}</section>'
        for name, note, svg in plots
    )
    return _PAGE.format(
        title=html.escape(title),
        meta=_meta(meta),
        table=_table(metrics),
        sections=sections,
    )


# --- plots -------------------------------------------------------------------------------------


def _figure(rows: int = 1, cols: int = 1, height: float = 3.6) -> tuple[Figure, Any]:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update(
        {
            "svg.fonttype": "none",  # text stays text: small files, the page's own font
            "svg.hashsalt": "aisched",  # the same ids every run
            "font.size": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
        }
    )
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]  # the XML prologue and DOCTYPE are not for inline use
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)  # RDF boilerplate


def _cdf(ax: Axes, series: Sequence[PolicySeries], pick: str, floor_s: float) -> None:
    drawn = False
    for s in series:
        q: np.ndarray = getattr(s, pick)
        if q.size:
            ax.step(np.maximum(q / HOUR, floor_s / HOUR), QUANTILES, where="post", label=s.policy)
            drawn = True
    ax.set_xscale("log")
    ax.set_xlabel("hours (log scale)")
    ax.set_ylabel("share of jobs")
    ax.set_ylim(0, 1.01)
    if drawn:
        ax.legend(loc="lower right")
    else:
        ax.text(0.5, 0.5, "no job finished", transform=ax.transAxes, ha="center")


def _jct_cdf(series: Sequence[PolicySeries]) -> str:
    fig, axes = _figure()
    _cdf(axes[0][0], series, "jct_quantiles_s", 1.0)
    return _svg(fig)


def _queueing_cdf(series: Sequence[PolicySeries]) -> str:
    fig, axes = _figure()
    _cdf(axes[0][0], series, "queueing_quantiles_s", 1.0)
    return _svg(fig)


def _mid_hours(s: PolicySeries) -> np.ndarray:
    e = s.bin_edges_s
    return np.asarray((e[:-1] + e[1:]) / 2 / HOUR)


def _utilisation(series: Sequence[PolicySeries]) -> str:
    fig, axes = _figure()
    ax = axes[0][0]
    for s in series:
        if s.autoscaled:  # a bin with no node present holds no allocation either
            share = np.divide(
                s.allocated_gpus,
                s.present_gpus,
                out=np.zeros_like(s.allocated_gpus),
                where=s.present_gpus > 0,
            )
        else:
            share = s.allocated_gpus / (s.capacity_gpus or 1.0)
        ax.plot(_mid_hours(s), 100 * share, label=s.policy, linewidth=1.2)
    ax.set_ylim(0, 105)
    ax.set_xlabel("hours since the first submission")
    ax.set_ylabel("GPUs allocated (%)")
    ax.legend(loc="lower right")
    return _svg(fig)


def _pending(series: Sequence[PolicySeries]) -> str:
    fig, axes = _figure()
    ax = axes[0][0]
    for s in series:
        ax.plot(_mid_hours(s), s.pending_jobs, label=s.policy, linewidth=1.2)
    ax.set_xlabel("hours since the first submission")
    ax.set_ylabel("jobs waiting")
    ax.legend(loc="upper right")
    return _svg(fig)


def _demand(series: Sequence[PolicySeries]) -> str:
    fig, axes = _figure(rows=len(series), height=2.6)
    for ax_row, s in zip(axes, series, strict=True):
        ax = ax_row[0]
        x = _mid_hours(s)
        ax.fill_between(x, s.demand_gpus, color="#b8bfcc", alpha=0.6, label="arrived demand")
        ax.plot(x, s.allocated_gpus, color="#2f6fd6", linewidth=1.2, label="allocated")
        if s.autoscaled:
            ax.plot(
                x,
                s.present_gpus,
                color="#1d2330",
                linewidth=0.8,
                linestyle=":",
                label="GPUs present",
            )
        else:
            ax.axhline(
                s.capacity_gpus, color="#1d2330", linewidth=0.8, linestyle=":", label="capacity"
            )
        if s.demand_gpus.size and s.demand_gpus.max() > 3 * s.capacity_gpus > 0:
            ax.set_yscale("log")  # a long queue would flatten the allocation on a linear scale
            ax.set_ylabel("GPUs (log scale)")
        else:
            ax.set_ylabel("GPUs")
        ax.set_title(s.policy, loc="left", fontsize=9)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1][0].set_xlabel("hours since the first submission")
    return _svg(fig)


def _nodes(series: Sequence[PolicySeries]) -> str:
    fig, axes = _figure()
    ax = axes[0][0]
    for s in series:
        if s.autoscaled:
            ax.plot(_mid_hours(s), s.billed_nodes, label=s.policy, linewidth=1.2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("hours since the first submission")
    ax.set_ylabel("nodes billed")
    ax.legend(loc="upper right")
    return _svg(fig)


def _queues(series: Sequence[PolicySeries]) -> str:
    names = list(dict.fromkeys(q.queue for s in series for q in s.queues))
    cols = 2
    rows = (len(names) + cols - 1) // cols
    fig, axes = _figure(rows=rows, cols=cols, height=2.4)
    colors = [f"C{i}" for i in range(len(series))]
    for i, name in enumerate(names):
        ax = axes[i // cols][i % cols]
        for s, color in zip(series, colors, strict=True):
            q = next((q for q in s.queues if q.queue == name), None)
            if q is None:
                continue
            x = _mid_hours(s)
            ax.plot(x, q.allocated_gpus, color=color, linewidth=1.1, label=s.policy)
            ax.plot(x, q.demand_gpus, color=color, linewidth=0.8, linestyle="--")
        ax.set_title(name, loc="left", fontsize=9)
        ax.set_ylabel("GPUs")
        if i == 0:
            ax.legend(loc="upper right", fontsize=8)
    for j in range(len(names), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    return _svg(fig)


# --- page --------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _meta(meta: Mapping[str, Any]) -> str:
    cluster = meta.get("cluster") or {}
    parts = [
        f"trace <b>{html.escape(str(meta.get('trace', '-')))}</b>",
        f"{meta.get('jobs', 0):,} jobs",
        f"cluster: {cluster.get('nodes', 0):,} nodes, {cluster.get('gpus', 0):,} GPUs",
    ]
    if "estimator" in meta:
        parts.append(f"runtime estimates: {html.escape(str(meta['estimator']))}")
    return " · ".join(parts)


def _table(metrics: Sequence[PolicyMetrics]) -> str:
    head = "".join(f"<th>{html.escape(m.policy)}</th>" for m in metrics)
    rows = "".join(
        ('<tr class="machine-dependent">' if label in MACHINE_DEPENDENT_ROWS else "<tr>")
        + f"<td>{html.escape(label)}</td>"
        + "".join(f'<td class="num">{html.escape(fmt(m))}</td>' for m in metrics)
        + "</tr>"
        for label, fmt in METRIC_ROWS
    )
    return f'<table id="figures"><tr><th>metric</th>{head}</tr>{rows}</table>'


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ margin: 0 auto; max-width: 960px; padding: 16px 24px; color: #1d2330;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }}
h1 {{ font-size: 20px; margin: 8px 0 4px; }}
h2 {{ font-size: 16px; margin: 28px 0 2px; }}
.meta, .note {{ color: #6b7385; margin: 0 0 8px; }}
table {{ border-collapse: collapse; font-size: 13px; }}
th, td {{ border-bottom: 1px solid #dde1e8; padding: 3px 10px; text-align: left; }}
td.num, th + th {{ text-align: right; font-variant-numeric: tabular-nums; }}
tr.machine-dependent td {{ color: #6b7385; font-style: italic; }}
svg {{ max-width: 100%; height: auto; }}
</style>
</head>
<body>
<h1>{title}</h1>
<p class="meta">{meta}</p>
{table}
{sections}
</body>
</html>
"""
