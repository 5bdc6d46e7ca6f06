"""Policy files: presets by name, YAML files, and errors that name the file and the entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from aisched.core.policy import PRESETS, PolicyError, build_policy, preset
from aisched.service.config import load_config
from aisched.spec import SpecError, load_policy
from aisched.spec.cluster import load_cluster_file
from aisched.spec.policy import load_policy_file

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "policies"


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds(name: str) -> None:
    assert load_policy(name).name == name


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_policy_files_load(path: Path) -> None:
    policy = load_policy(str(path))
    assert policy.name == path.stem
    assert policy.action_names()[0] == "enqueue"


def test_a_file_means_what_its_preset_means(tmp_path: Path) -> None:
    f = load_policy(
        write(
            tmp_path,
            "actions: [enqueue, allocate, {name: backfill, reservations: 1}]\norder: [fifo]\n",
        )
    )
    p = preset("fifo-backfill")
    assert (f.actions, f.order, f.scores) == (p.actions, p.order, p.scores)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("actions: [enqueue, allocat]\n", "policy.actions[1]: unknown action 'allocat'"),
        ("actions: [enqueue]\nordr: [fifo]\n", "policy: unknown key 'ordr'"),
        (
            "actions: [{name: backfill, reservations: lots}]\n",
            "policy.actions[0].reservations: expected int",
        ),
        (
            "actions: [{name: preempt, by: size}]\n",
            "policy.actions[0]: by must be 'priority' or 'order'",
        ),
        ("actions: [enqueue]\nscore: [{name: binpack, weight: -1}]\n", "policy.score[0].weight"),
        (
            "actions: [enqueue]\nscore: [{name: binpack, weight: .nan}]\n",
            "policy.score[0].weight: expected a number from 0 to 1,000,000, got nan",
        ),
        (
            "actions: [enqueue]\nscore: [{name: binpack, weight: 1.0e+307}]\n",
            "policy.score[0].weight: expected a number from 0 to 1,000,000, got 1e+307",
        ),
        ("actions: [enqueue]\norder: [{name: las, thresholds_gpu_s: [10, 5]}]\n", "increasing"),
        ("actions: []\n", "policy.actions: at least one action is required"),
        # Failed mid-run ("bind of ..., which is not pending"); scheduled nothing, silently.
        ("actions: [enqueue, allocate, allocate]\n", "policy.actions[2]: allocate is listed twice"),
        ("actions: [allocate]\n", "policy.actions: enqueue is missing"),
        ("actions: [enqueue\n", "p.yaml:2:1: YAML syntax error"),
        ("- just a list\n", "must be a mapping"),
    ],
)
def test_bad_policy_files_name_file_and_entry(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as err:
        load_policy(path)
    assert path in str(err.value)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "order: [{name: las, thresholds_gpu_s: [a, b]}]",
            "policy.order[0]: las: thresholds_gpu_s: expected numbers of GPU-seconds, 0 or "
            "more, got 'a'",
        ),
        ("order: [{name: las, thresholds_gpu_s: [~]}]", "got None"),
        ("order: [{name: las, thresholds_gpu_s: [1, x]}]", "got 'x'"),
        ("order: [{name: las, thresholds_gpu_s: [.nan]}]", "got nan"),
        ("score: [{name: random, seed: 1.5}]", "policy.score[0].seed: expected int, got 1.5"),
        (
            "actions: [enqueue, {name: backfill, reservations: .nan}]",
            "policy.actions[1].reservations: expected int, got nan",
        ),
        (
            "actions: [{name: enqueue, starving_min_gpus: .nan}]",
            "policy.actions[0]: starving_min_gpus must be 0 or more",
        ),
        (
            "actions: [{name: enqueue, starving_after_s: .nan}]",
            "policy.actions[0]: starving_after_s must be 0 (off) or more",
        ),
        ("score: [{name: hetero, long_s: .nan}]", "policy.score[0]: long_s must be 0 or more"),
        ("score: [{name: hetero, large_gpus: -1}]", "large_gpus must be 0 or more, got -1"),
    ],
)
def test_a_value_no_cycle_can_use_is_refused_with_its_entry(
    tmp_path: Path, entry: str, message: str
) -> None:
    """Each was accepted: a threshold or seed that is no number failed every cycle (a
    TypeError from the simulator, a service that never scheduled again); NaN turned a rule off
    without a word."""
    text = entry if entry.startswith("actions") else f"actions: [enqueue, allocate]\n{entry}"
    path = write(tmp_path, text + "\n")
    with pytest.raises(SpecError) as err:
        load_policy(path)
    assert str(err.value).startswith(f"{path}: policy.")
    assert message in str(err.value)


def test_a_policy_with_a_bad_seed_or_threshold_no_longer_fails_its_cycles() -> None:
    """What the refused values did: every cycle that placed or ordered a job raised."""
    from aisched.core.cycle import run_cycle
    from aisched.core.snapshot import snapshot_of
    from aisched.testing import cluster, job, node

    snap = snapshot_of(cluster(node("n1").gpus(2)))
    pending = (job("a").task(gpu=1).pending(attained_gpu_s=10.0),)
    for doc in (
        {"actions": ["enqueue", "allocate"], "score": [{"name": "random", "seed": 1.5}]},
        {"actions": ["enqueue", "allocate"], "order": [{"name": "las", "thresholds_gpu_s": ["a"]}]},
    ):
        try:
            policy = build_policy(doc)
        except PolicyError:
            continue
        run_cycle(snap, pending, policy, 0.0)  # raised TypeError before the fix


def test_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(
        SpecError, match="unknown policy 'nope'; presets: bestfit, default, dotprod, drf"
    ):
        load_policy("nope")
    with pytest.raises(PolicyError, match="unknown policy"):
        preset("nope")


def test_an_empty_or_overlong_policy_name_is_no_file(tmp_path: Path) -> None:
    # `policy: ""` (or --policy "") was read as a policy file at "", the current directory:
    # ".: cannot read policy file: Is a directory".
    with pytest.raises(SpecError, match="^unknown policy ''; presets: bestfit, default"):
        load_policy("")
    # A name longer than a file name may be: Path.exists raised OSError (a traceback).
    with pytest.raises(SpecError, match="^unknown policy 'xxxx"):
        load_policy("x" * 300)
    config = tmp_path / "config.yaml"
    config.write_text("policy: ''\n")
    with pytest.raises(SpecError, match=f"^{config}: policy: unknown policy ''; presets: "):
        load_config(config)
    # Named by the flag (an override), the error says so.
    with pytest.raises(SpecError, match="^--policy: unknown policy 'nope'; presets: "):
        load_config(config, {"policy": "nope"})


def test_build_policy_refuses_a_non_mapping() -> None:
    with pytest.raises(PolicyError, match="expected a mapping"):
        build_policy(["fifo"])  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["policy", "cluster", "service config"])
def test_a_spec_file_that_is_not_utf8_or_missing_is_refused_naming_it(
    tmp_path: Path, kind: str
) -> None:
    """Each went through its own read; the policy and service config files let a
    UnicodeDecodeError through (a traceback from `aisched up --config`)."""
    load, what = {
        "policy": (load_policy_file, "policy file"),
        "cluster": (load_cluster_file, ""),
        "service config": (lambda p: load_config(p), "config file"),
    }[kind]
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: \xff\n")
    with pytest.raises(SpecError) as info:
        load(bad)
    assert str(info.value) == f"{bad}: not UTF-8 text: invalid start byte"
    missing = tmp_path / "missing.yaml"
    with pytest.raises(SpecError) as info:
        load(missing)
    cannot = f"cannot read {what}" if what else "cannot read"
    assert str(info.value) == f"{missing}: {cannot}: No such file or directory"
