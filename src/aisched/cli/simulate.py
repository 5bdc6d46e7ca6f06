"""`aisched simulate`: replay a trace under one or more policies and compare their figures.

All input is resolved and checked before the first simulation starts (trace, cluster, every
policy, the config), so a typo in the last policy name costs nothing. Results go to stdout as
tables (`--json FILE` also writes them as JSON); progress goes to stderr, only when it is a
terminal.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from aisched.cli.errors import EXIT_FAILURE, CLIError
from aisched.cli.options import whole
from aisched.cli.printable import plain, printable
from aisched.core.policy import PLACEMENT_SCORES, PRESETS, Policy, with_eta
from aisched.model.cluster import Cluster, capacity_of
from aisched.model.gpu_speed import GpuSpeeds
from aisched.model.queue import QueueTree
from aisched.service.config import load_config
from aisched.sim.engine import SimConfig, SimulationError, simulate
from aisched.sim.estimators import ESTIMATORS, estimator_for
from aisched.sim.html_report import ReportUnavailable, require_matplotlib, write_report
from aisched.sim.metrics import PolicyMetrics, compute_metrics
from aisched.sim.report import metrics_table, queue_table, write_json
from aisched.sim.series import PolicySeries, compute_series
from aisched.sim.traces import (
    Trace,
    fit_gangs_to,
    load_openb_nodes,
    load_openb_pods,
    load_philly,
    one_queue,
    synthetic_trace,
)
from aisched.spec.cluster import resolve_cluster
from aisched.spec.errors import SpecError
from aisched.spec.policy import load_policy

TRACE_CHOICES = ("philly", "openb", "openb:VARIANT", "synthetic", "PATH")
SYNTHETIC_JOBS = 500  # --jobs' default
# The built-in cluster each built-in trace is replayed on when it brings none of its own.
DEFAULT_CLUSTER = {"philly": "philly", "synthetic": "small"}
_DEFAULTS = SimConfig()


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate",
        help="replay a trace under several policies and compare them",
        description="Replay a workload trace in virtual time under each policy and print "
        "JCT, queueing delay, utilisation and preemptions side by side.",
    )
    p.add_argument(
        "--trace",
        default="synthetic",
        help="philly, openb (or openb:VARIANT, e.g. openb:gpushare40), synthetic, or a path "
        "to a Philly or openb pod-list CSV (default: synthetic)",
    )
    p.add_argument(
        "--cluster",
        help="philly, small, openb or a cluster YAML file (default: the trace's own cluster, "
        "else philly for philly and small for synthetic)",
    )
    p.add_argument(
        "--policy",
        help="comma-separated presets or policy YAML files (default: fifo); presets: "
        f"{', '.join(PRESETS)}",
    )
    p.add_argument("--limit", type=whole(1, 10**9), help="replay only the first N jobs by arrival")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="leave out trace rows that cannot be used (a 0-GPU job in a GPU trace, a "
        "fractional or empty time in a pod list) and say how many, instead of refusing the trace",
    )
    p.add_argument(
        "--one-queue",
        action="store_true",
        help="put every job in one queue: a cluster-wide order instead of one fair-shared "
        "queue per Philly VC (an openb pod list is one queue already)",
    )
    p.add_argument(
        "--queues",
        type=Path,
        metavar="FILE",
        help="replay under the queues of FILE, a service config file (its queues: list, read "
        "as aisched up reads it: guarantee, limit, borrowing, user_limit); every queue the "
        "trace's jobs name must be in it (default: one flat queue per Philly VC; openb: one queue)",
    )
    p.add_argument(
        "--jobs",
        type=whole(1, 10**9),
        help=f"synthetic trace: number of jobs (default: {SYNTHETIC_JOBS})",
    )
    p.add_argument("--seed", type=int, help="synthetic trace: random seed (default: 0)")
    p.add_argument(
        "--checkpoint-interval",
        type=float,
        metavar="S",
        help="seconds between checkpoints of a job that sets none "
        f"(default: {_DEFAULTS.checkpoint_interval_s:g})",
    )
    p.add_argument(
        "--restart-cost",
        type=float,
        metavar="S",
        help=f"seconds a restarted job spends restoring (default: {_DEFAULTS.restart_cost_s:g})",
    )
    p.add_argument(
        "--interval",
        type=float,
        metavar="S",
        help="scheduling period; 0 runs a cycle at every event "
        f"(default: {_DEFAULTS.cycle_interval_s:g})",
    )
    p.add_argument(
        "--estimator",
        choices=ESTIMATORS,
        help="runtime estimates given to the scheduler: the learned predictor (predict), the "
        "true durations (oracle), the jobs' own (own); auto: oracle for *-oracle policies, "
        "own for policies that read no estimate (fifo, las, ...), predict for the rest "
        "(default: auto)",
    )
    p.add_argument(
        "--eta",
        action="store_true",
        help="estimate a start time for every waiting job in every cycle and report how "
        "accurate the first one was (costs time on a long queue)",
    )
    p.add_argument(
        "--saturate",
        action="store_true",
        help="fill the cluster instead of replaying time (the FGD paper's experiment): tasks "
        "arrive in trace order and never leave, and the table gives the GPU allocated and "
        "the GPU demand left unallocated when the arrived demand reaches each --targets share",
    )
    p.add_argument(
        "--placement",
        help="with --saturate: comma-separated placement presets or policy files to compare "
        f"(default: {','.join(PLACEMENT_SCORES)})",
    )
    p.add_argument(
        "--targets",
        default="0.9,0.95,1.0",
        help="with --saturate: shares of GPU capacity arrived at which to report "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--gpu-speeds",
        metavar="SPEC",
        help="runtimes depend on the GPU model: 'default' (the built-in table) or "
        "MODEL=SPEED,... (e.g. V100=1,T4=0.4); unlisted models run at 1.0",
    )
    p.add_argument(
        "--pools-at-max",
        action="store_true",
        help="replay the cluster file's autoscaling pools fixed at their maximum size, for "
        "comparing node-hours and JCT with the autoscaled run",
    )
    p.add_argument("--max-time", type=float, metavar="S", help="stop at this virtual time")
    p.add_argument(
        "--json", type=_path_given, metavar="FILE", help="also write the figures as JSON"
    )
    p.add_argument(
        "--report",
        type=_path_given,
        metavar="DIR",
        help="also write DIR/index.html: the figures with plots (needs the report extra)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--validate", action="store_true", help="check invariants after every cycle (slow)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.trace != "synthetic":
        # Each was ignored without a word: a trace is replayed as it is.
        if args.jobs is not None:
            raise CLIError(
                "--jobs goes with --trace synthetic; to replay the first N jobs of a trace, "
                "use --limit N"
            )
        if args.seed is not None:
            raise CLIError("--seed goes with --trace synthetic; a trace is replayed as it is")
    trace, kind = load_trace(
        args.trace,
        limit=args.limit,
        jobs=SYNTHETIC_JOBS if args.jobs is None else args.jobs,
        seed=args.seed or 0,
        skip=args.skip_invalid,
    )
    if trace.skipped:
        # On stderr, before any simulation: what was left out, and the first reason why.
        Console(stderr=True, highlight=False).print(
            plain(
                f"skipped {trace.skipped:,} row{'s' if trace.skipped != 1 else ''} that cannot "
                f"be used (--skip-invalid); the first: {trace.first_skipped}"
            ),
            soft_wrap=True,
        )
    if not trace.jobs:
        # A header and no rows (or none usable) ran, and printed a table of nothing.
        why = "--skip-invalid left out every row" if trace.skipped else "the trace holds none"
        raise CLIError(f"--trace {args.trace}: no job to replay ({why})")
    cluster = choose_cluster(args.cluster, trace, kind)
    if args.pools_at_max:
        if not cluster.node_pools:
            raise CLIError("--pools-at-max: the cluster has no autoscaling pools")
        cluster = cluster.at_max()
    # A trace that records only GPU counts was split for 8-GPU servers; on smaller nodes a job
    # asking for more than a node has runs as a gang over several.
    trace, split = fit_gangs_to(trace, cluster)
    if args.json is not None:
        _prepare_json_file(args.json)
    if args.report is not None and args.report.exists() and not args.report.is_dir():
        # Said before the run: it was said only after the whole of it.
        raise CLIError(f"--report: {args.report} is a file; give a folder for index.html")
    if args.saturate:
        if args.queues is not None:
            raise CLIError("--queues goes with replaying time; --saturate fills without queues")
        # Each was ignored without a word (--report wrote nothing).
        for flag, given in (
            ("--report", args.report is not None),
            ("--eta", args.eta),
            ("--one-queue", args.one_queue),
            ("--max-time", args.max_time is not None),
            ("--gpu-speeds", args.gpu_speeds is not None),
            ("--policy", args.policy is not None),
            ("--estimator", args.estimator is not None),
            ("--interval", args.interval is not None),
            ("--checkpoint-interval", args.checkpoint_interval is not None),
            ("--restart-cost", args.restart_cost is not None),
        ):
            if given:
                raise CLIError(
                    f"{flag} goes with replaying time; --saturate fills the cluster without "
                    "time (compare placements with --placement)"
                )
        if cluster.node_pools and not args.pools_at_max:
            raise CLIError(
                "--saturate fills a fixed cluster; add --pools-at-max to fill the autoscaling "
                "pools at their maximum"
            )
        return run_saturation(args, trace, cluster)
    if args.placement is not None:
        raise CLIError("--placement goes with --saturate; to replay time, use --policy")
    if args.one_queue:
        trace = one_queue(trace)
    queues = load_queues(args.queues, trace)
    policies = load_policies(args.policy or "fifo")
    if args.eta:
        policies = [with_eta(p) for p in policies]
    try:
        config = SimConfig(
            checkpoint_interval_s=_or(args.checkpoint_interval, _DEFAULTS.checkpoint_interval_s),
            restart_cost_s=_or(args.restart_cost, _DEFAULTS.restart_cost_s),
            cycle_interval_s=_or(args.interval, _DEFAULTS.cycle_interval_s),
            validate=args.validate,
            max_time_s=args.max_time,
            gpu_speeds=parse_gpu_speeds(args.gpu_speeds, cluster),
        )
    except ValueError as e:
        said = str(e)
        for field, flag in _FLAGS_OF_FIELDS:  # the flag the user gave, not the field's name
            said = said.replace(field, flag)
        raise CLIError(said) from None
    estimator = args.estimator or "auto"
    series: list[PolicySeries] | None = None
    if args.report is not None:
        try:
            require_matplotlib()
        except ReportUnavailable as e:
            raise CLIError(str(e)) from None
        _check_writable("--report", args.report / "index.html")
        series = []

    out = Console()
    if not out.is_terminal:
        # A pipe or file gets rich's 80 columns, which would wrap every label; give the tables
        # the width they need instead.
        out = Console(width=max(100, 36 + 14 * len(policies)))
    show_progress = not args.no_progress and sys.stderr.isatty()
    results: list[PolicyMetrics] = []
    # A policy whose run aborts (a SimulationError) is said at the end; the others still run
    # and are shown, rather than lost with it.
    failed: list[tuple[str, str]] = []
    with ExitStack() as stack:
        bar: Progress | None = None
        if show_progress:
            bar = stack.enter_context(
                Progress(
                    TextColumn("{task.description}", markup=False),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=Console(stderr=True),
                    transient=True,
                )
            )
        for policy in policies:
            callback = _progress_callback(bar, policy.name)
            try:
                result = simulate(
                    trace,
                    cluster,
                    policy,
                    config,
                    callback,
                    estimator=estimator_for(policy, estimator),
                    queues=queues,
                )
            except SimulationError as e:
                failed.append((policy.name, str(e)))
                continue
            results.append(compute_metrics(result))
            if series is not None:
                series.append(compute_series(result))
    if not results:
        raise CLIError(_failures(failed), EXIT_FAILURE)

    gpus = cluster.total_gpus
    out.print(
        Text.assemble(
            "trace ",
            plain(trace.name, "bold"),
            f": {len(trace):,} jobs; cluster: {len(cluster.nodes):,} nodes, {gpus:,} GPUs",
        )
    )
    if split:
        out.print(
            f"{split:,} jobs ask for more GPUs than a node has: each runs as a gang over "
            "several nodes"
        )
    for line in describe_pools(cluster):
        out.print(plain(line), soft_wrap=True)
    for note in [] if queues is None else queues.guarantees_beyond(capacity_of(cluster.nodes)):
        out.print(plain(f"queues: {note}"), soft_wrap=True)
    out.print(metrics_table(results, plain))
    out.print(queue_table(results, plain, title="per queue"))
    meta = {
        "trace": trace.name,
        "jobs": len(trace),
        "cluster": {
            "nodes": len(cluster.nodes),
            "gpus": gpus,
            "node_pools": [dataclasses.asdict(p) for p in cluster.node_pools],
        },
        "config": dataclasses.asdict(config),
        "estimator": estimator,
    }
    if failed:
        meta["failed"] = [{"policy": name, "error": said} for name, said in failed]
    if args.json is not None:
        try:
            write_json(args.json, results, meta)
        except OSError as e:
            raise CLIError(f"--json: cannot write {args.json}: {e.strerror or e}") from None
    if args.report is not None and series is not None:
        try:
            page = write_report(args.report, results, series, meta)
        except OSError as e:
            raise CLIError(f"--report: cannot write {args.report}: {e.strerror or e}") from None
        out.print(plain(f"report: {page}"), soft_wrap=True)  # a path to copy, never broken
    if failed:
        done = ", ".join(m.policy for m in results)
        raise CLIError(f"{_failures(failed)}; the figures above are of {done}", EXIT_FAILURE)
    return 0


def _failures(failed: list[tuple[str, str]]) -> str:
    return "; ".join(f"policy {name}: {said}" for name, said in failed)


def load_trace(
    name: str, *, limit: int | None, jobs: int, seed: int, skip: bool = False
) -> tuple[Trace, str]:
    """The trace and its kind (philly, openb, synthetic); `skip`: leave out rows the loader
    cannot use, counted in `Trace.skipped`."""
    if limit is not None and limit < 0:
        raise CLIError(f"--limit must be >= 0, got {limit}")
    try:
        if name == "philly":
            return load_philly(limit=limit, skip_invalid=skip), "philly"
        if name == "openb" or name.startswith("openb:"):
            variant = name.partition(":")[2] or "default"
            return load_openb_pods(variant=variant, limit=limit, skip_invalid=skip), "openb"
        if name == "synthetic":
            if jobs < 0:
                raise CLIError(f"--jobs must be >= 0, got {jobs}")
            trace = synthetic_trace(jobs, seed=seed)
            if limit is not None:
                trace = Trace(trace.name, trace.jobs[:limit], trace.cluster)
            return trace, "synthetic"
        path = Path(name)
        if not path.exists():
            raise CLIError(
                f"--trace {name!r}: not a built-in trace and no such file; "
                f"expected one of {', '.join(TRACE_CHOICES)}"
            )
        kind = _sniff(path)
        if kind == "philly":
            return load_philly(path, limit=limit, skip_invalid=skip), kind
        return load_openb_pods(path, limit=limit, skip_invalid=skip), kind
    except (OSError, ValueError) as e:  # missing trace files, TraceError
        raise CLIError(str(e)) from None


_PHILLY_COLUMNS = frozenset({"timestamp", "duration", "num_gpus"})
_OPENB_COLUMNS = frozenset({"cpu_milli", "num_gpu", "gpu_milli"})


def _sniff(path: Path) -> str:
    """philly or openb, from the CSV's header row."""
    file = path / "philly.csv" if path.is_dir() and (path / "philly.csv").is_file() else path
    if file.is_dir():
        return "openb"  # a folder of openb pod lists; the loader names the file it wants
    with file.open(encoding="utf-8-sig", errors="replace") as fh:
        line = fh.readline()
    if not line.strip():
        what = "the file is empty" if not line else "the first line is blank"
        raise CLIError(f"--trace {path}: {what}; expected a CSV header row")
    header = {c.strip() for c in line.split(",")}
    # Any column of one kind decides it, so that its loader names the columns still missing.
    if header & _PHILLY_COLUMNS:
        return "philly"
    if header & _OPENB_COLUMNS:
        return "openb"
    philly, openb = (", ".join(sorted(c)) for c in (_PHILLY_COLUMNS, _OPENB_COLUMNS))
    raise CLIError(
        f"--trace {path}: header matches neither a Philly CSV ({philly}) "
        f"nor an openb pod list ({openb})"
    )


def choose_cluster(name: str | None, trace: Trace, kind: str) -> Cluster:
    try:
        if name is None:
            if trace.cluster is not None:
                return trace.cluster
            if kind in DEFAULT_CLUSTER:
                return resolve_cluster(DEFAULT_CLUSTER[kind])
            raise CLIError(f"trace {trace.name} brings no cluster; give one with --cluster")
        if name == "openb":
            return load_openb_nodes()
        return resolve_cluster(name)
    except (OSError, ValueError) as e:  # SpecError, TraceError, missing node list
        said = str(e)
        if said.startswith("unknown built-in cluster"):  # openb's node list is one too
            said = said.replace("; built-ins: ", "; built-ins: openb, ", 1)
        raise CLIError(said) from None


def load_queues(path: Path | None, trace: Trace) -> QueueTree | None:
    """`--queues FILE`: the queue tree of a service config file, read by the service's own
    parser, so a file `aisched up` takes replays alike and a bad one is refused with the same
    message (naming the file and the field). A trace job whose queue the file does not name
    would be rejected as never fitting: such a trace is refused up front instead."""
    if path is None:
        return None
    try:
        config = load_config(path)
        tree = config.queue_tree(str(path))
    except SpecError as e:
        raise CLIError(str(e)) from None
    if "queues" not in config.model_fields_set:
        raise CLIError(f"--queues {path}: no queues: list in it")
    unknown = sorted({tj.job.queue for tj in trace.jobs if not tree.has(tj.job.queue)})
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if unknown[5:] else "")
        hint = (
            "add them"
            if unknown == ["default"]
            else "add them, or --one-queue to put every job in queue default"
        )
        raise CLIError(
            f"--queues {path}: the trace's jobs use queues it does not name: {shown} ({hint})"
        )
    return tree


def describe_pools(cluster: Cluster) -> list[str]:
    """One line per autoscaling pool: `autoscaling pool NAME: MIN..MAX nodes of G GPUs (...)`."""
    parts = []
    for p in cluster.node_pools:
        if p.min_nodes == p.max_nodes:
            size = f"fixed at {p.max_nodes}"
        else:
            size = f"{p.min_nodes}..{p.max_nodes}"
        extra = f"up in {p.provisioning_delay_s:g} s, idle out after {p.scale_down_idle_s:g} s"
        if p.cost_per_node_hour is not None:
            extra += f", {p.cost_per_node_hour:g}/node-hour"
        parts.append(
            f"autoscaling pool {p.name}: {size} nodes of {len(p.template.gpus)} GPUs ({extra})"
        )
    return parts


def load_policies(spec: str) -> list[Policy]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise CLIError("--policy: give at least one policy")
    policies: list[Policy] = []
    for n in names:
        try:
            policies.append(_load_one_policy(n))
        except (OSError, ValueError) as e:  # PolicyError, SpecError, unreadable file
            raise CLIError(str(e)) from None
    seen: set[str] = set()
    for p in policies:
        if p.name in seen:
            raise CLIError(f"--policy: {p.name} is given twice")
        seen.add(p.name)
    return policies


def _load_one_policy(spec: str) -> Policy:
    """A preset by name, or a policy YAML file (named after the file unless it says `name`)."""
    try:
        return load_policy(spec)
    except SpecError as e:
        raise CLIError(str(e)) from None


def _progress_callback(bar: Progress | None, name: str) -> Callable[[int, int], None] | None:
    if bar is None:
        return None
    task = bar.add_task(printable(name), total=None)  # a policy file's name: user text

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return update


def parse_gpu_speeds(text: str | None, cluster: Cluster | None = None) -> GpuSpeeds | None:
    """`--gpu-speeds`: None, 'default', or MODEL=SPEED pairs separated by commas. A model
    given twice is refused (the last one won without a word); with `cluster`, a model none of
    its nodes (nor an autoscaling pool's template) has is warned about on stderr: models are
    matched exactly, so `t4=0.5` changed nothing on T4 nodes, silently."""
    if text is None:
        return None
    if text.strip() == "default":
        return GpuSpeeds()
    speeds: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        model, eq, value = part.partition("=")
        try:
            speed = float(value)
        except ValueError:
            speed = -1.0
        if not eq or not model.strip() or not 0 < speed < float("inf"):
            raise CLIError(
                f"--gpu-speeds: {part!r} is not MODEL=SPEED with a positive speed "
                "(e.g. V100=1,T4=0.4), nor 'default'"
            )
        name = model.strip()
        if name in speeds:
            raise CLIError(f"--gpu-speeds: {name} is given twice ({speeds[name]:g} and {speed:g})")
        speeds[name] = speed
    if cluster is not None:
        have = {n.gpu_model for n in cluster.nodes} | {
            p.template.gpu_model for p in cluster.node_pools
        }
        models = sorted(m for m in have if m is not None)
        for name in speeds:
            if name not in have:
                _warn(
                    f"--gpu-speeds: no node of the cluster has a GPU of model {name!r}, so its "
                    f"speed is not used (the cluster's models: {', '.join(models) or 'none'})"
                )
    return GpuSpeeds.of_mapping(speeds)


def _warn(message: str) -> None:
    Console(stderr=True, highlight=False).print(
        Text.assemble(("warning:", "yellow"), " ", plain(message)), soft_wrap=True
    )


def _or(given: float | None, default: float) -> float:
    """A flag's value, or its default where it was not given (None: told apart from a value
    equal to the default, so that --saturate can refuse a flag that was given)."""
    return default if given is None else given


def parse_targets(text: str) -> list[float]:
    try:
        targets = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise CLIError(f"--targets: expected shares such as 0.9,1.0, got {text!r}") from None
    if not targets or any(not 0 < t <= 10 for t in targets):
        raise CLIError(
            f"--targets: expected shares of capacity above 0 and at most 10 (0.9 is 90 %), "
            f"got {text!r}"
        )
    return targets


_FLAGS_OF_FIELDS = (
    ("checkpoint_interval_s", "--checkpoint-interval"),
    ("restart_cost_s", "--restart-cost"),
    ("cycle_interval_s", "--interval"),
    ("max_time_s", "--max-time"),
)


def _prepare_json_file(path: Path) -> None:
    """Make `--json`'s folder, as --report makes its own (`--json out/run.json`, as the docs
    write it, failed in a checkout without out/), and refuse a folder for the file or one
    that cannot be written: all before the run, not after it."""
    if path.is_dir():
        raise CLIError(f"--json: {path} is a folder; give a file name, e.g. {path / 'run.json'}")
    _check_writable("--json", path)


def _check_writable(flag: str, path: Path) -> None:
    """Make `path`'s folder and check that `path` can be written, before the run: a read-only
    folder was found only once every simulation had finished, and their results were lost.
    An existing file is opened to append (nothing is cut nor written); else a file is made
    in the folder and removed."""
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CLIError(f"{flag}: cannot make the folder {folder}: {e.strerror or e}") from None
    try:
        if path.exists():
            with path.open("a", encoding="utf-8"):
                pass
        else:
            fd, probe = tempfile.mkstemp(prefix=".aisched-write-check-", dir=folder)
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise CLIError(f"{flag}: cannot write {path}: {e.strerror or e}") from None


def _path_given(text: str) -> Path:
    """A path argument that is not empty: `--report ''` wrote ./index.html without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return Path(text)


def run_saturation(args: argparse.Namespace, trace: Trace, cluster: Cluster) -> int:
    """`simulate --saturate`: fill the cluster under each placement and print one table."""
    from rich.table import Table

    from aisched.sim.saturation import TABLE_HEADER, saturate, table_rows

    policies = load_policies(args.placement or ",".join(PLACEMENT_SCORES))
    targets = parse_targets(args.targets)
    jobs = [tj.job for tj in trace.jobs]
    results = []
    for policy in policies:
        try:
            results.append(
                saturate(
                    jobs,
                    cluster,
                    policy,
                    targets=targets,
                    trace_name=trace.name,
                    validate=args.validate,
                )
            )
        except (SimulationError, ValueError) as e:
            raise CLIError(f"policy {policy.name}: {e}", EXIT_FAILURE) from None
    out = Console() if Console().is_terminal else Console(width=120)
    out.print(
        Text.assemble(
            "trace ",
            plain(trace.name, "bold"),
            f" filled until {max(targets):.0%} of GPU capacity arrived; "
            f"cluster: {len(cluster.nodes):,} nodes, {cluster.total_gpus:,} GPUs",
        )
    )
    table = Table(*TABLE_HEADER)
    for row in table_rows(results):
        table.add_row(*map(plain, row))
    out.print(table)
    if args.json is not None:
        import json

        doc = {
            "trace": trace.name,
            "cluster": {"nodes": len(cluster.nodes), "gpus": cluster.total_gpus},
            "results": [dataclasses.asdict(r) for r in results],
        }
        try:
            args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        except OSError as e:
            raise CLIError(f"--json: cannot write {args.json}: {e.strerror or e}") from None
    return 0
