"""Bad policy and config files, generated: refused with the file and the entry named, or taken
and then usable, never an exception of another kind (a traceback from `aisched up` or
`simulate`, or a service whose every cycle fails on a value its file let through).

A policy that is accepted must run: each accepted one schedules a small cluster through two
cycles (reservations, preemption, every order and score plugin). A config that is accepted must
give every value the service reads from it (`ServiceConfig`'s conversions).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from bad_input import BAD_VALUES, SETTINGS, paths, set_at
from hypothesis import given
from hypothesis import strategies as st

from aisched.core.cycle import run_cycle
from aisched.core.decisions import TaskBinding
from aisched.core.snapshot import RunningJob, snapshot_of
from aisched.service.config import load_config
from aisched.spec.errors import SpecError
from aisched.spec.policy import load_policy_file
from aisched.testing import cluster, job, node

# Every action, and plugins with every argument, at valid values.
POLICY: dict[str, Any] = {
    "name": "fuzz",
    "actions": [
        {
            "name": "enqueue",
            "starving_after_s": 600,
            "starving_min_gpus": 4,
            "starving_after_backlog": 1.0,
            "due_after_median_waits": 2.0,
            "due_after_backlog": 1.0,
            "backlog_bound": "waited",
        },
        {"name": "allocate", "reservations": 1, "strict": False},
        {
            "name": "preempt",
            "by": "order",
            "scope": "cluster",
            "factor": 2.0,
            "min_run_s": 60,
            "count_lost_work": True,
            "bound": "upper",
            "restart_cost_s": 60,
            "min_run_checkpoints": 1,
        },
        "reclaim",
        {"name": "backfill", "reservations": 2},
        "eta",
    ],
    "order": [
        {"name": "las", "thresholds_gpu_s": [3600, 36000]},
        {"name": "qssf", "aging": 1.0},
        {"name": "sjf", "by": "gpu_time"},
        "priority",
        "drf",
        "fifo",
    ],
    "score": [
        {"name": "binpack", "weight": 1},
        {"name": "fgd", "weight": 1, "weigh_by": "tasks", "feed": False, "fit_by": "mean"},
        {"name": "random", "weight": 0.5, "seed": 3},
        {"name": "hetero", "weight": 2, "speeds": {"A100": 1.0, "T4": 0.4}, "long_s": 600},
        "topology",
    ],
    "victims": ["lowest-priority", "least-work-lost", "newest", "longest-remaining"],
    "queue_depth": 100,
    "node_sample": 8,
}

# Numbers a type check lets through as "a number": the plugins must bound them themselves.
NUMBERS = [math.nan, math.inf, -math.inf, -1, -0.5, 0, 0.5, 1.5, 1e308, 2**63, -(2**63), 10**30]
_NUMBERS = st.sampled_from(NUMBERS)
# Every entry is also tried with each of these (besides the generated values), so that no
# entry is left to chance.
EACH = [math.nan, math.inf, -1, 1.5, "", "12Q", "x" * 300, True, None, {"a": 1}]


def _cluster_cycles(policy: Any) -> None:
    """Two cycles of `policy` over two 4-GPU nodes: one running job, a blocked gang, small
    jobs with and without estimates, one long waiting."""
    c = cluster(node("n1").gpus(4).rack("r1"), node("n2").gpus(4, model="T4").rack("r2"))
    running = job("run").gang(2, gpu=2).priority(-5).estimate(500).build()
    held = RunningJob(
        running,
        (TaskBinding("worker", 0, "n1", (0, 1)), TaskBinding("worker", 1, "n1", (2, 3))),
        started_s=0.0,
        attained_gpu_s=50.0,
        expected_end_s=500.0,
        checkpoint_interval_s=100.0,
    )
    pending = (
        job("big").gang(2, gpu=4).priority(5).submitted(1.0).pending(estimate_s=1000.0),
        job("small").task(gpu=1).estimate(30).submitted(2.0).pending(estimate_s=30.0),
        job("cpu").task(cpu=2).submitted(3.0).pending(),
        job("old").task(gpu=2).submitted(-1e5).pending(attained_gpu_s=4e4),
    )
    for now in (10.0, 1e6):
        run_cycle(snapshot_of(c, (held,)), pending, policy, now)


@st.composite
def bad_policy(draw: st.DrawFn) -> dict[str, Any]:
    doc = yaml.safe_load(yaml.safe_dump(POLICY))
    at = draw(st.sampled_from(list(paths(doc))))
    set_at(doc, at, draw(st.one_of(_NUMBERS, BAD_VALUES)))
    return doc  # type: ignore[no-any-return]


def _policy_file(doc: Any, tmp: Path) -> Path:
    f = tmp / "policy.yaml"
    f.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return f


def test_the_policy_mutated_below_is_valid(tmp_path: Path) -> None:
    _cluster_cycles(load_policy_file(_policy_file(POLICY, tmp_path)))


@SETTINGS
@given(doc=bad_policy())
def test_a_bad_policy_file_is_refused_or_runs(doc: dict[str, Any], tmp_path: Path) -> None:
    f = _policy_file(doc, tmp_path)
    try:
        policy = load_policy_file(f)
    except SpecError as e:
        assert str(e).startswith(f"{f}: policy"), str(e)  # the file and the entry
        return
    _cluster_cycles(policy)


@pytest.mark.parametrize("at", list(paths(POLICY)), ids=str)
def test_every_policy_entry_refuses_bad_values_or_runs(at: tuple[Any, ...], tmp_path: Path) -> None:
    for value in EACH:
        doc = yaml.safe_load(yaml.safe_dump(POLICY))
        set_at(doc, at, value)
        f = _policy_file(doc, tmp_path)
        try:
            policy = load_policy_file(f)
        except SpecError as e:
            assert str(e).startswith(f"{f}: policy"), str(e)
            continue
        _cluster_cycles(policy)


# --- config files -------------------------------------------------------------------------

CONFIG: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": 18250,
    "cycle_interval": "1s",
    "eta_interval": "5s",
    "max_backoff": "5m",
    "policy": "priority",
    "memory_limit": "none",
    "container_runtime": "none",
    "lease_ttl": "8s",
    "lease_renew": "2s",
    "defaults": {"grace_period": "30s", "max_retries": 3, "backoff": "10s"},
    "limits": {
        "log_max_size": "10M",
        "log_max_files": 3,
        "disk_min_free": "256M",
        "shutdown_grace": "10s",
        "keep_ended": "30d",
        "keep_audit": "365d",
        "shm_max_size": "1G",
        "request_rate": 20.0,
        "request_burst": 200,
        "user_max_jobs": 100,
    },
    "priority_classes": {"low": -100, "high": 100},
    "node": {"name": "box", "gpus": 2, "gpu_model": "A100", "gpu_mem": "80G", "cpus": 8},
    "admins": {"users": ["ana"], "groups": ["ops"]},
    "queues": [
        {"name": "default"},
        {
            "name": "team",
            "weight": 2,
            "guarantee": {"gpus": 1, "cpus": 4, "mem": "16G"},
            "limit": {"gpus": 2},
            "user_limit": {"gpus": 1},
            "users": ["ana"],
            "max_priority": 100,
        },
    ],
}


def _config_values(cfg: Any) -> None:
    """Every value the service reads from its config."""
    cfg.queue_tree()
    cfg.build_policy()
    cfg.job_defaults("ana")
    cfg.lease_times()
    cfg.socket_path()
    cfg.home()
    cfg.database_url()
    limits = cfg.limits
    limits.log_max_bytes()
    limits.shm_max_mib()
    limits.disk_min_free_bytes()
    limits.rate_budgets()
    for holder in (cfg, limits):  # every duration, in seconds
        for name in dir(holder):
            if name.endswith("_s") and callable(getattr(holder, name)):
                getattr(holder, name)()
    cfg.max_priority(("team",))
    cfg.queue_acl("team")


@st.composite
def bad_config(draw: st.DrawFn) -> dict[str, Any]:
    doc = yaml.safe_load(yaml.safe_dump(CONFIG))
    at = draw(st.sampled_from(list(paths(doc))))
    set_at(doc, at, draw(st.one_of(_NUMBERS, BAD_VALUES)))
    return doc  # type: ignore[no-any-return]


@SETTINGS
@given(doc=bad_config())
def test_a_bad_config_file_is_refused_or_usable(doc: dict[str, Any], tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text(yaml.safe_dump(doc, allow_unicode=True))
    try:
        cfg = load_config(f)
    except SpecError as e:
        assert all(line.startswith(str(f)) for line in e.problems), e.problems
        return
    _config_values(cfg)


@pytest.mark.parametrize("at", list(paths(CONFIG)), ids=str)
def test_every_config_entry_refuses_bad_values_or_is_usable(
    at: tuple[Any, ...], tmp_path: Path
) -> None:
    f = tmp_path / "config.yaml"
    for value in EACH:
        doc = yaml.safe_load(yaml.safe_dump(CONFIG))
        set_at(doc, at, value)
        f.write_text(yaml.safe_dump(doc, allow_unicode=True))
        try:
            cfg = load_config(f)
        except SpecError as e:
            # A policy is named by its preset or its own file (`aisched.spec.policy`).
            said = str(f) if at != ("policy",) else ""
            assert all(line.startswith(said) for line in e.problems), e.problems
            assert at != ("policy",) or "policy" in str(e), str(e)
            continue
        _config_values(cfg)


def test_the_config_mutated_above_is_valid(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text(yaml.safe_dump(CONFIG))
    _config_values(load_config(f))
