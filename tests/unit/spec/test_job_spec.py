"""Job files, native and Volcano: the whole `Job` each valid document builds, the exact lines
each mistake gives, the warnings for what aisched cannot honour, and junk never escaping as
anything but a SpecError."""

from __future__ import annotations

import contextlib
import copy
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aisched.executors.base import TaskPlace, contract_env
from aisched.model.cluster import TopologyLevel
from aisched.model.job import (
    ContainerSpec,
    Job,
    JobKind,
    NetworkMode,
    RestartPolicy,
    TaskGroup,
    TopologyMode,
    TopologyRequirement,
    Volume,
)
from aisched.model.resources import Resources
from aisched.spec import (
    DEFAULT_PRIORITY_CLASSES,
    JobDefaults,
    ParsedJob,
    SpecError,
    load_job_file,
    parse_job_document,
    parse_job_text,
)
from aisched.spec.job_common import SCHEDULER_ENV

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "jobs"
GIB = 1024
KNOWN_CLASSES = "critical (1000), high (100), normal (0), low (-100)"


def group(
    name: str = "main",
    replicas: int = 1,
    command: tuple[str, ...] = ("python", "x.py"),
    *,
    cpu: int = 1000,
    mem: int = 1024,
    gpu: int = 0,
    gpu_milli: int = 0,
    gpu_mem: int = 0,
    env: tuple[tuple[str, str], ...] = (),
    workdir: str | None = None,
    container: ContainerSpec | None = None,
    kubernetes_pod: bool = False,
) -> TaskGroup:
    return TaskGroup(
        name=name,
        replicas=replicas,
        request=Resources(
            milli_cpu=cpu, mem_mib=mem, gpu=gpu, gpu_milli=gpu_milli, gpu_mem_mib=gpu_mem
        ),
        command=command,
        env=env,
        workdir=workdir,
        container=container,
        kubernetes_pod=kubernetes_pod,
    )


def job(*groups: TaskGroup, **over: Any) -> Job:
    over.setdefault("name", "python")
    return Job(id="", groups=groups or (group(),), **over)


@dataclass(frozen=True)
class Valid:
    name: str
    doc: Any
    want: Job
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Invalid:
    name: str
    doc: Any
    want: list[str] = field(default_factory=list)


# --- native: valid --------------------------------------------------------------------------

NATIVE_VALID = [
    Valid("a command list", {"command": ["python", "x.py"]}, job()),
    Valid(
        "a shell string",
        {"command": "python x.py > out.txt"},
        job(group(command=("/bin/sh", "-c", "python x.py > out.txt"))),
    ),
    Valid(
        # Every user sees every job's name: not the values a shell string sets first.
        "a shell string's name skips the variables it sets",
        {"command": "HF_TOKEN=hf_secret A=1 /opt/bin/train --x"},
        job(
            group(command=("/bin/sh", "-c", "HF_TOKEN=hf_secret A=1 /opt/bin/train --x")),
            name="train",
        ),  # fmt: skip
    ),
    Valid(
        "a shell string that only sets variables is named job",
        {"command": "HF_TOKEN=hf_secret"},
        job(group(command=("/bin/sh", "-c", "HF_TOKEN=hf_secret")), name="job"),
    ),
    Valid(
        "the name comes from the program's base name",
        {"command": ["/usr/bin/python3.11", "x.py"]},
        job(group(command=("/usr/bin/python3.11", "x.py")), name="python3.11"),
    ),
    Valid(
        "a program name made a valid job name",
        {"command": ["./run!.sh"]},
        job(group(command=("./run!.sh",)), name="run-.sh"),
    ),
    Valid(
        # The value's second word is not taken for the program (`command_name`).
        "a shell string's name skips a quoted value with a space",
        {"command": 'HF_TOKEN="hf_abc hf_secretpart" python3 -c pass'},
        job(
            group(command=("/bin/sh", "-c", 'HF_TOKEN="hf_abc hf_secretpart" python3 -c pass')),
            name="python3",
        ),  # fmt: skip
    ),
    Valid(
        "integers in a command and env become strings",
        {"command": ["python", "x.py", "--epochs", 10], "env": {"SEED": 7}},
        job(group(command=("python", "x.py", "--epochs", "10"), env=(("SEED", "7"),))),
    ),
    Valid(
        "the one-task shorthand",
        {
            "name": "sweep",
            "command": ["python", "x.py"],
            "replicas": 3,
            "env": {"B": "2", "A": "1"},
            "workdir": "/srv/exp",
            "resources": {"cpus": "500m", "mem": "2G", "gpus": 1, "gpu_mem": "16G"},
        },
        job(
            group(
                replicas=3,
                cpu=500,
                mem=2 * GIB,
                gpu=1,
                gpu_mem=16 * GIB,
                env=(("B", "2"), ("A", "1")),  # file order kept
                workdir="/srv/exp",
            ),
            name="sweep",
        ),
    ),
    Valid(
        "gpu_mem is per GPU",
        {"command": ["python", "x.py"], "resources": {"gpus": 4, "gpu_mem": "20G"}},
        job(group(gpu=4, gpu_mem=80 * GIB)),
    ),
    Valid(
        "a share of a GPU",
        {"command": ["python", "x.py"], "resources": {"gpus": 0.25, "gpu_mem": "10G"}},
        job(group(gpu_milli=250, gpu_mem=10 * GIB)),
    ),
    Valid(
        "a share of a GPU in thousandths",
        {"command": ["python", "x.py"], "resources": {"gpu_milli": 300, "gpu_mem": "6G"}},
        job(group(gpu_milli=300, gpu_mem=6 * GIB)),
    ),
    Valid(
        "required and preferred GPU models",
        {
            "command": ["python", "x.py"],
            "gpu_models": {"required": ["T4", "V100"], "preferred": ["V100"]},
        },
        job(gpu_models=("T4", "V100"), gpu_models_preferred=("V100",)),
    ),
    Valid(
        "preferred GPU models alone: any model may run it",
        {"command": ["python", "x.py"], "gpu_models": {"preferred": ["A100"]}},
        job(gpu_models_preferred=("A100",)),
    ),
    Valid(
        "a gang with every field",
        {
            "name": "train-llm",
            "kind": "train",
            "queue": "research",
            "user": "alice",
            "priority": -5,
            "preemptible": False,
            "min_available": 3,
            "gpu_models": ["A100", "H100-80GB"],
            "topology": {"pack": "rack", "spread": "node", "mode": "preferred"},
            "restart": {"policy": "always", "max_retries": 0, "backoff": 0},
            "time_limit": "2h",
            "estimate": "1h30m",
            "checkpoint_interval": 600,
            "grace_period": "0s",
            "tasks": [
                {
                    "name": "ps",
                    "command": "python ps.py",
                    "resources": {"cpus": 2, "mem": "8G"},
                },
                {
                    "name": "worker",
                    "replicas": 4,
                    "command": ["torchrun", "train.py"],
                    "resources": {"cpus": 8, "mem": "64G", "gpus": 2},
                },
            ],
        },
        Job(
            id="",
            groups=(
                group("ps", command=("/bin/sh", "-c", "python ps.py"), cpu=2000, mem=8 * GIB),
                group("worker", 4, ("torchrun", "train.py"), cpu=8000, mem=64 * GIB, gpu=2),
            ),
            name="train-llm",
            kind=JobKind.TRAIN,
            user="alice",
            queue="research",
            priority=-5,
            preemptible=False,
            min_available=3,
            topology=TopologyRequirement(
                pack=TopologyLevel.RACK, mode=TopologyMode.PREFERRED, spread=TopologyLevel.NODE
            ),
            gpu_models=("A100", "H100-80GB"),
            restart_policy=RestartPolicy.ALWAYS,
            max_retries=0,
            time_limit_s=7200.0,
            estimate_s=5400.0,
            checkpoint_interval_s=600.0,
            grace_period_s=0.0,
            backoff_s=0.0,
        ),
    ),
    Valid(
        "a priority class",
        {"command": ["python", "x.py"], "priority_class": "critical"},
        job(priority=1000),
    ),
    Valid(
        "restart never, other fields from the defaults",
        {"command": ["python", "x.py"], "restart": {"policy": "never"}, "kind": "infer"},
        job(restart_policy=RestartPolicy.NEVER, kind=JobKind.INFER),
    ),
]


@pytest.mark.parametrize("case", NATIVE_VALID, ids=lambda c: c.name)
def test_native_valid(case: Valid) -> None:
    assert parse_job_document(case.doc, "j.yaml") == ParsedJob(case.want, "native", ())


def test_native_yaml_and_json_text_alike() -> None:
    doc = NATIVE_VALID[5].doc
    from_yaml = parse_job_text(yaml.safe_dump(doc, sort_keys=False), "j.yaml")
    from_json = parse_job_text(json.dumps(doc), "j.json")
    assert from_yaml == from_json == ParsedJob(NATIVE_VALID[5].want, "native")


def test_defaults_fill_what_the_file_leaves_out() -> None:
    defaults = JobDefaults(
        user="bob",
        queue="batch",
        priority_classes={"urgent": 50},
        grace_period_s=5.0,
        max_retries=7,
        backoff_s=1.0,
    )
    got = parse_job_document(
        {"command": ["python", "x.py"], "priority_class": "urgent"}, "j.yaml", defaults
    )
    assert got.job == job(
        user="bob", queue="batch", priority=50, grace_period_s=5.0, max_retries=7, backoff_s=1.0
    )
    with pytest.raises(SpecError) as info:
        parse_job_document({"command": ["x"], "priority_class": "high"}, "j.yaml", defaults)
    assert info.value.problems == (
        "j.yaml: priority_class: unknown priority class 'high'; known: urgent (50)",
    )


def test_default_priority_classes() -> None:
    assert dict(DEFAULT_PRIORITY_CLASSES) == {
        "low": -100,
        "normal": 0,
        "high": 100,
        "critical": 1000,
    }
    assert JobDefaults().priority_classes == DEFAULT_PRIORITY_CLASSES


# --- native: errors -------------------------------------------------------------------------

CMD = {"command": ["python", "x.py"]}


def _res(**r: Any) -> dict[str, Any]:
    return {**CMD, "resources": r}


NATIVE_INVALID = [
    Invalid("not a mapping", [1], ["j.yaml: expected a job: a mapping with a command or tasks, "
                                   "or a Volcano Job; got a list"]),
    Invalid("empty", None, ["j.yaml: expected a job: a mapping with a command or tasks, or a "
                            "Volcano Job; got an empty document"]),
    Invalid("no command", {"name": "x"}, ["j.yaml: command: a job needs a command (or a list of "
                                          "tasks)"]),
    Invalid("unknown key", {**CMD, "gpu": 1}, ["j.yaml: gpu: unknown key"]),
    Invalid("empty command list", {"command": []}, ["j.yaml: command: is empty: give the program "
                                                    "and its arguments, e.g. [python, train.py]"]),
    Invalid("blank command string", {"command": "  "}, ["j.yaml: command: is empty: give the "
                                                        "program to run"]),
    Invalid("empty program", {"command": ["", "x"]}, ["j.yaml: command: the program name (word "
                                                      "0, the first) is empty"]),
    Invalid("command of the wrong type", {"command": {"python": 1}},
            ["j.yaml: command: expected a list of words (e.g. [python, train.py]) or a shell "
             "command string, got a dict"]),
    Invalid("a float word", {"command": ["x", 1.5]},
            ["j.yaml: command.1: expected a string, got 1.5 (a number): quote it"]),
    Invalid("replicas above the limit", {**CMD, "replicas": 10_001},
            ["j.yaml: replicas: must be at most 10,000, got 10001"]),
    Invalid("zero replicas", {**CMD, "replicas": 0},
            ["j.yaml: replicas: must be at least 1, got 0"]),
    Invalid("a boolean for a count", {**CMD, "replicas": True},
            ["j.yaml: replicas: expected an integer, got true (a boolean)"]),
    Invalid("cpus above the limit", _res(cpus=100_001),
            ["j.yaml: resources.cpus: 100001 is more than the limit of 100,000 CPUs"]),
    Invalid("zero cpus", _res(cpus=0), ["j.yaml: resources.cpus: must be more than 0"]),
    Invalid("mem above the limit", _res(mem="2P"),
            ["j.yaml: resources.mem: 2P is more than the limit of 1P"]),
    Invalid("mem without a unit", _res(mem=8),
            ["j.yaml: resources.mem: 8 has no unit: give a unit, e.g. 8G or 512M"]),
    Invalid("gpus above the limit", _res(gpus=4097),
            ["j.yaml: resources.gpus: 4097 is more than the limit of 4096 GPUs per task"]),
    Invalid("a fraction above one GPU", _res(gpus=1.5),
            ["j.yaml: resources.gpus: 1.5: more than one GPU must be a whole number; a share "
             "(0 to 1) is of one GPU"]),
    Invalid("negative gpus", _res(gpus=-1), ["j.yaml: resources.gpus: -1 is negative"]),
    Invalid("gpus and gpu_milli together", _res(gpus=1, gpu_milli=500),
            ["j.yaml: resources.gpu_milli: give gpus or gpu_milli, not both"]),
    Invalid("gpu_milli of a whole GPU", _res(gpu_milli=1000),
            ["j.yaml: resources.gpu_milli: 1000 is not a share of one GPU: give thousandths "
             "from 1 to 999 (250 is a quarter); ask for whole GPUs with gpus"]),
    Invalid("gpu_milli of nothing", _res(gpu_milli=0),
            ["j.yaml: resources.gpu_milli: 0 is not a share of one GPU: give thousandths from 1 "
             "to 999 (250 is a quarter); ask for whole GPUs with gpus"]),
    Invalid("gpu_milli as a fraction", _res(gpu_milli=0.5),
            ["j.yaml: resources.gpu_milli: expected an integer, got 0.5 (a number)"]),
    Invalid("gpu_models as a bare string", {**CMD, "gpu_models": "T4"},
            ["j.yaml: gpu_models: expected a list of GPU models (e.g. [A100, H100]) or a "
             "mapping {required: [...], preferred: [...]}"]),
    Invalid("a GPU model that is not a name", {**CMD, "gpu_models": [1]},
            ["j.yaml: gpu_models.required.0: expected a GPU model name such as A100 or "
             "H100-80GB, got 1 (an integer)"]),
    Invalid("a preferred GPU model that is not a name",
            {**CMD, "gpu_models": {"required": ["T4"], "preferred": [True]}},
            ["j.yaml: gpu_models.preferred.0: expected a GPU model name such as A100 or "
             "H100-80GB, got true (a boolean)"]),
    Invalid("a preferred model outside the required ones",
            {**CMD, "gpu_models": {"required": ["T4"], "preferred": ["A100"]}},
            ["j.yaml: gpu_models.preferred.0: 'A100' is not among the required models (T4): "
             "the job could never run there"]),
    Invalid("a required model twice", {**CMD, "gpu_models": {"required": ["T4", "T4"]}},
            ["j.yaml: gpu_models.required.1: 'T4' repeats required.0"]),
    Invalid("an unknown key under gpu_models", {**CMD, "gpu_models": {"wanted": ["T4"]}},
            ["j.yaml: gpu_models.wanted: unknown key"]),
    Invalid("gpu_mem without gpus", _res(gpu_mem="8G"),
            ["j.yaml: resources.gpu_mem: needs gpus: ask for a GPU or a share of one"]),
    Invalid("time limit above 366 days", {**CMD, "time_limit": "367d"},
            ["j.yaml: time_limit: 367d is more than the limit of 366d"]),
    Invalid("zero estimate", {**CMD, "estimate": 0}, ["j.yaml: estimate: must be more than 0"]),
    Invalid("negative backoff", {**CMD, "restart": {"backoff": -1}},
            ["j.yaml: restart.backoff: -1 is negative"]),
    Invalid("max_retries above the limit", {**CMD, "restart": {"max_retries": 1001}},
            ["j.yaml: restart.max_retries: must be at most 1,000, got 1001"]),
    Invalid("unknown restart policy", {**CMD, "restart": {"policy": "OnFailure"}},
            ["j.yaml: restart.policy: expected 'never', 'on-failure' or 'always', got "
             "'OnFailure' (a string)"]),
    Invalid("grace period above an hour", {**CMD, "grace_period": "61m"},
            ["j.yaml: grace_period: 61m is more than the limit of 1h"]),
    Invalid("bad job name", {**CMD, "name": "my job"},
            ["j.yaml: name: 'my job' is not a valid name: 1 to 63 letters, digits, '.', '_' or "
             "'-', starting with a letter or digit"]),
    Invalid("task name too long", {"tasks": [{"name": "t" * 64, **CMD}]},
            [f"j.yaml: tasks.0.name: '{'t' * 64}' is not a valid name: 1 to 63 letters, digits, "
             "'.', '_' or '-', starting with a letter or digit"]),
    Invalid("task names repeat", {"tasks": [{"name": "w", **CMD}, {"name": "w", **CMD}]},
            ["j.yaml: tasks.1.name: 'w' is already the name of tasks.0"]),
    Invalid("a task needs a name and a command", {"tasks": [{"replicas": 2}]},
            ["j.yaml: tasks.0.name: Field required", "j.yaml: tasks.0.command: Field required"]),
    Invalid("no tasks", {"tasks": []}, ["j.yaml: tasks: a job needs at least one task"]),
    Invalid("tasks and the shorthand together",
            {"tasks": [{"name": "w", **CMD}], **CMD, "replicas": 2},
            ["j.yaml: command: cannot be used together with tasks: put it inside a task",
             "j.yaml: replicas: cannot be used together with tasks: put it inside a task"]),
    Invalid("bad env name", {**CMD, "env": {"MY-VAR": "1"}},
            ["j.yaml: env.MY-VAR: 'MY-VAR' is not a valid environment variable name: letters, "
             "digits and '_', not starting with a digit"]),
    Invalid("env value of the wrong type", {**CMD, "env": {"DEBUG": True, "LR": 0.1}},
            ["j.yaml: env.DEBUG: expected a string, got true (a boolean): quote it",
             "j.yaml: env.LR: expected a string, got 0.1 (a number): quote it"]),
    Invalid("unknown priority class", {**CMD, "priority_class": "urgent"},
            [f"j.yaml: priority_class: unknown priority class 'urgent'; known: {KNOWN_CLASSES}"]),
    Invalid("priority and a class", {**CMD, "priority": 5, "priority_class": "high"},
            ["j.yaml: priority_class: give priority or priority_class, not both"]),
    Invalid("absurd priority", {**CMD, "priority": 10**12},
            ["j.yaml: priority: must be at most 1,000,000,000, got 1000000000000"]),
    Invalid("a class's name as the priority", {**CMD, "priority": "high"},
            ["j.yaml: priority: expected an integer, got 'high' (a string): a priority class "
             "goes in priority_class (priority_class: high)"]),
    Invalid("a fraction as the priority", {**CMD, "priority": 1.5},
            ["j.yaml: priority: expected an integer, got 1.5 (a number)"]),
    Invalid("a task's negative replicas", {"tasks": [{"name": "w", "command": ["x"],
                                                       "replicas": -1}]},
            ["j.yaml: tasks.0.replicas: must be at least 1, got -1"]),
    Invalid("min_available zero", {**CMD, "min_available": 0},
            ["j.yaml: min_available: must be at least 1, got 0"]),
    Invalid("min_available above the tasks", {**CMD, "replicas": 2, "min_available": 3},
            ["j.yaml: min_available: 3 is more than the job's 2 tasks"]),
    Invalid("spread not inside pack", {**CMD, "topology": {"pack": "node", "spread": "rack"}},
            ["j.yaml: topology.spread: must be a smaller level than pack (node): one task per "
             "rack inside one node leaves room for one task"]),
    Invalid("unknown topology level", {**CMD, "topology": {"pack": "cluster"}},
            ["j.yaml: topology.pack: expected 'node', 'rack' or 'zone', got 'cluster' (a string)"]),
    Invalid("unknown kind", {**CMD, "kind": "training"},
            ["j.yaml: kind: expected 'train', 'infer', 'batch' or 'service', got 'training' "
             "(a string)"]),
    Invalid("a Kubernetes kind without apiVersion", {"kind": "Job", "spec": {}},
            ["j.yaml: kind: 'Job' without apiVersion; a Volcano Job needs apiVersion: "
             "batch.volcano.sh/v1alpha1, and a native job's kind is train, infer, batch or "
             "service"]),
    Invalid("resources not a mapping", {**CMD, "resources": [1]},
            ["j.yaml: resources: Input should be a mapping (key: value pairs)"]),
    Invalid("a bad workdir", {**CMD, "workdir": ""}, ["j.yaml: workdir: is empty"]),
    Invalid(
        "every field problem at once",
        {"name": "", "command": [], "replicas": -1, "resources": {"cpus": "x", "mem": "1"},
         "typo": 1},
        ["j.yaml: name: '' is not a valid name: 1 to 63 letters, digits, '.', '_' or '-', "
         "starting with a letter or digit",
         "j.yaml: command: is empty: give the program and its arguments, e.g. [python, train.py]",
         "j.yaml: replicas: must be at least 1, got -1",
         "j.yaml: resources.cpus: 'x' is not a CPU count: give e.g. 4, 0.5 or 500m",
         "j.yaml: resources.mem: '1' has no unit: give a unit, e.g. 8G or 512M",
         "j.yaml: typo: unknown key"],
    ),
    Invalid(
        "every cross-field problem at once",
        {"tasks": [{"name": "a", **CMD}, {"name": "a", **CMD}], "env": {}, "min_available": 5,
         "priority": 1, "priority_class": "low"},
        ["j.yaml: env: cannot be used together with tasks: put it inside a task",
         "j.yaml: tasks.1.name: 'a' is already the name of tasks.0",
         "j.yaml: min_available: 5 is more than the job's 2 tasks",
         "j.yaml: priority_class: give priority or priority_class, not both"],
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", NATIVE_INVALID, ids=lambda c: c.name)
def test_native_errors(case: Invalid) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_document(case.doc, "j.yaml")
    assert list(info.value.problems) == case.want


def test_what_no_program_could_be_started_with_is_refused_at_submission() -> None:
    # Accepted, each failed at every start with "Argument list too long" and was retried.
    big = "x" * 200_000
    doc = {"name": "n" * 5000, "command": ["echo", big], "env": {"BIG": big, "N" * 300: "v"}}
    with pytest.raises(SpecError) as info:
        parse_job_document(doc, "j.yaml")
    exec_limit = "a program gets at most 130,048 bytes in each argument or variable"
    assert list(info.value.problems) == [
        f"j.yaml: name: {'n' * 63!r}... is not a valid name: 1 to 63 letters, digits, '.', "
        "'_' or '-', starting with a letter or digit",
        f"j.yaml: command.1: is 200,000 bytes: {exec_limit} (the kernel's limit); put it in a file",
        f"j.yaml: env.BIG: is 200,000 bytes: {exec_limit} (the kernel's limit); put it in a file",
        f"j.yaml: env.{'N' * 300}: is longer than 256 characters",
    ]
    fits = "y" * 130_000
    parse_job_document({"command": ["echo", fits], "env": {"BIG": fits}}, "j.yaml")


RESERVED = sorted(SCHEDULER_ENV) + ["AISCHED_JOB_ID", "AISCHED_ANYTHING"]


@pytest.mark.parametrize("name", RESERVED)
def test_scheduler_env_cannot_be_overridden(name: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_document({**CMD, "env": {name: "x"}}, "j.yaml")
    assert info.value.problems == (
        f"j.yaml: env.{name}: set by the scheduler; cannot be overridden",
    )


def test_a_job_cannot_name_the_gpus_nvidias_runtime_exposes_to_its_container() -> None:
    # NVIDIA_VISIBLE_DEVICES=all would give a container every GPU of the node where NVIDIA's
    # runtime hook is installed, whichever it was given.
    with pytest.raises(SpecError) as info:
        parse_job_document({**CMD, "env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "j.yaml")
    assert info.value.problems == (
        "j.yaml: env.NVIDIA_VISIBLE_DEVICES: set by the scheduler; cannot be overridden",
    )


def test_every_contract_variable_is_reserved() -> None:
    env = contract_env(
        job_id="j",
        places=[TaskPlace("w-0", "n1", (0,), 1000)],
        rank=0,
        restart_count=0,
        checkpoint_dir="/c",
        master_addr="n1",
        master_port=29500,
    )
    assert all(k in SCHEDULER_ENV or k.startswith("AISCHED_") for k in env)


# --- Volcano --------------------------------------------------------------------------------


def vc(*tasks: dict[str, Any], name: str = "vj", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {**spec, "tasks": list(tasks) or [task()]},
    }


def task(name: str | None = "w", replicas: int | None = None, **container: Any) -> dict[str, Any]:
    pod = container.pop("pod", {})
    task_extra = container.pop("task", {})
    c = {"name": "c", "image": "busybox", "command": ["python", "x.py"], **container}
    t: dict[str, Any] = {"template": {"spec": {"containers": [c], **pod}}, **task_extra}
    if name is not None:
        t["name"] = name
    if replicas is not None:
        t["replicas"] = replicas
    return t


C0 = "spec.tasks.0.template.spec.containers.0"
BUSYBOX = ContainerSpec("busybox")


def _pod(g: TaskGroup) -> TaskGroup:
    """A group as a pod template makes it: its container's workdir is inside its image."""
    c = None if g.container is None else replace(g.container, workdir_in_image=True)
    return replace(g, kubernetes_pod=True, container=c)


def vjob(*groups: TaskGroup, **over: Any) -> Job:
    """A job of a Volcano file: its groups come from pod templates."""
    over.setdefault("name", "vj")
    pods = tuple(_pod(g) for g in groups or (group("w"),))
    return Job(id="", groups=pods, **over)


VOLCANO_VALID = [
    Valid("the least", vc(), vjob(group("w", container=BUSYBOX))),
    Valid(
        "no image, no name, no replicas: Volcano's defaults",
        vc({"template": {"spec": {"containers": [{"command": ["python", "x.py"]}]}}}),
        vjob(group("default0")),
    ),
    Valid(
        "command and args, env, workingDir, limits over requests",
        vc(
            task(
                replicas=2,
                command=["python"],
                args=["x.py", "--lr", "0.1"],
                env=[{"name": "A", "value": "1"}, {"name": "EMPTY"}],
                workingDir="/work",
                resources={
                    "requests": {"cpu": "500m", "memory": "1Gi"},
                    "limits": {"memory": "2Gi", "nvidia.com/gpu": 1},
                },
            )
        ),
        vjob(
            group(
                "w",
                2,
                ("python", "x.py", "--lr", "0.1"),
                cpu=500,
                mem=2 * GIB,
                gpu=1,
                env=(("A", "1"), ("EMPTY", "")),
                workdir="/work",
                container=BUSYBOX,
            )
        ),
    ),
    Valid(
        "job fields",
        vc(
            task(pod={"activeDeadlineSeconds": 600, "terminationGracePeriodSeconds": 45}),
            task(
                "ps",
                pod={"activeDeadlineSeconds": 900, "terminationGracePeriodSeconds": 5},
                image=None,
            ),
            queue="team-a",
            priorityClassName="low",
            maxRetry=9,
            minAvailable=1,
            runningEstimate="1h30m",
            plugins={"pytorch": ["--port=23456"]},
        ),
        vjob(
            group("w", container=BUSYBOX),
            group("ps"),
            kind=JobKind.TRAIN,
            queue="team-a",
            priority=-100,
            min_available=1,
            max_retries=9,
            time_limit_s=600.0,  # the smallest deadline
            estimate_s=5400.0,
            grace_period_s=45.0,  # the largest grace period
        ),
        (
            "v.yaml: spec.plugins.pytorch: --port=23456 not honoured: MASTER_PORT is a free port "
            "chosen when the job starts (a fixed port would clash between jobs on one host); "
            "read MASTER_PORT",
            "v.yaml: spec.minAvailable: 1 of the job's 2 tasks: aisched starts as many of the 2 "
            "tasks as fit at once (at least 1) and never starts the others later, as Volcano "
            "does; a job whose every task must run should leave minAvailable out (or set it to 2)",
        ),
    ),
    Valid(
        "minAvailable 0 means all tasks",
        vc(task(replicas=3, image=None), minAvailable=0),
        vjob(group("w", 3)),
    ),
    Valid(
        "the tasks' minAvailable add up",
        vc(
            task("m", image=None),
            task("w", replicas=4, image=None, task={"minAvailable": 2}),
        ),
        vjob(group("m"), group("w", 4), min_available=3),
        (
            "v.yaml: spec.tasks.1.minAvailable: aisched keeps one minimum for the whole job "
            "(3 of 5 tasks), not one per task",
            "v.yaml: spec.tasks: the tasks' minAvailable add up to 3 of the job's 5 tasks: "
            "aisched starts as many of the 5 tasks as fit at once (at least 3) and never starts "
            "the others later, as Volcano does; a job whose every task must run should leave "
            "minAvailable out",
        ),
    ),
    Valid(
        "not preemptible by annotation",
        {**vc(task(image=None)), "metadata": {
            "name": "vj", "annotations": {"volcano.sh/preemptable": "false"}}},
        vjob(preemptible=False),
    ),
    Valid(
        "not preemptible when a task's template says so",
        vc(task(image=None), task("b", image=None, task={"template": {
            "metadata": {"annotations": {"volcano.sh/preemptable": "False"}},
            "spec": {"containers": [{"command": ["python", "x.py"]}]}}})),
        vjob(group("w"), group("b"), preemptible=False),
    ),
    Valid(
        "not preemptible by a task template's label, as Volcano reads it without annotation",
        vc(task(image=None), task("b", image=None, task={"template": {
            "metadata": {"labels": {"volcano.sh/preemptable": "false"}},
            "spec": {"containers": [{"command": ["python", "x.py"]}]}}})),
        vjob(group("w"), group("b"), preemptible=False),
    ),
    Valid(
        "not preemptible by the job's label; its annotation comes first",
        {**vc(task(image=None)), "metadata": {
            "name": "vj", "labels": {"volcano.sh/preemptable": "false"}}},
        vjob(preemptible=False),
    ),
    Valid(
        "the job's annotation over its label",
        {**vc(task(image=None)), "metadata": {
            "name": "vj", "annotations": {"volcano.sh/preemptable": "true"},
            "labels": {"volcano.sh/preemptable": "false"}}},
        vjob(),
    ),
    Valid(
        "a Kueue queue label names the queue without spec.queue",
        {**vc(task(image=None)), "metadata": {
            "name": "vj", "labels": {"kueue.x-k8s.io/queue-name": "research"}}},
        vjob(queue="research"),
    ),
    Valid(
        "a KAI scheduler queue label, under spec.queue: warned about",
        {**vc(task(image=None), queue="team-a"), "metadata": {
            "name": "vj", "labels": {"kai.scheduler/queue": "research"}}},
        vjob(queue="team-a"),
        ("v.yaml: metadata.labels.kai.scheduler/queue: ignored: spec.queue names the job's "
         "queue (team-a)",),
    ),
    Valid(
        "a container's hostPID, hostIPC and topologySpreadConstraints are warned about",
        vc(task(pod={"hostPID": True, "hostIPC": True, "topologySpreadConstraints": [{}]})),
        vjob(group("w", container=BUSYBOX)),
        (
            "v.yaml: spec.tasks.0.template.spec.topologySpreadConstraints: ignored: aisched "
            "does not place tasks by node labels or affinity",
            "v.yaml: spec.tasks.0.template.spec.hostPID: ignored: a container has its own "
            "process IDs, not the host's",
            "v.yaml: spec.tasks.0.template.spec.hostIPC: ignored: a container has its own IPC, "
            "not the host's",
        ),
    ),
    Valid(
        "a task on the host shares the host's process IDs and IPC anyway",
        vc(task(image=None, pod={"hostPID": True, "hostIPC": True})),
        vjob(),
    ),
    Valid(
        "what aisched cannot honour is warned about, with its path",
        vc(
            task(
                volumeMounts=[{"name": "d", "mountPath": "/d"}],
                resources={"limits": {"example.com/fpga": 1, "ephemeral-storage": "1Gi"},
                           "requests": {"amd.com/gpu": 1}},
                securityContext={"privileged": True, "runAsUser": 0},
                pod={"volumes": [{"name": "d"}], "nodeSelector": {"gpu": "a100"},
                     "initContainers": [{"name": "i"}], "affinity": {"nodeAffinity": {}},
                     "priorityClassName": "high", "tolerations": [{"key": "k"}],
                     "securityContext": {"runAsUser": 0}},
                task={"maxRetry": 1, "dependsOn": {"name": ["m"]}, "topologyPolicy": "none"},
            ),
            volumes=[{"mountPath": "/data"}],
            plugins={"ssh": [], "svc": None, "env": []},
            networkTopology={"mode": "hard"},
            ttlSecondsAfterFinished=60,
            schedulerName="volcano",
        ),
        vjob(group("w", container=BUSYBOX)),
        (
            f"v.yaml: {C0}.resources.limits.example.com/fpga: ignored: aisched does not manage "
            "example.com/fpga",
            f"v.yaml: {C0}.resources.requests.amd.com/gpu: ignored: aisched does not manage "
            "amd.com/gpu",
            "v.yaml: spec.tasks.0.template.spec.volumes.0: ignored: aisched mounts only hostPath "
            "volumes into a container (d: no source)",
            "v.yaml: spec.tasks.0.template.spec.initContainers: not run: aisched runs only the "
            "task's container",
            "v.yaml: spec.tasks.0.template.spec.nodeSelector: ignored: aisched does not place "
            "tasks by node labels or affinity",
            "v.yaml: spec.tasks.0.template.spec.affinity: ignored: aisched does not place tasks "
            "by node labels or affinity",
            "v.yaml: spec.tasks.0.template.spec.priorityClassName: ignored: aisched reads "
            "spec.priorityClassName",
            *(
                f"v.yaml: {where}.securityContext: ignored: every task runs as the user who "
                "submits it, without privileges (docs/security.md)"
                for where in ("spec.tasks.0.template.spec", C0)
            ),
            "v.yaml: spec.tasks.0.maxRetry: ignored: aisched retries the whole job, up to "
            "spec.maxRetry",
            "v.yaml: spec.tasks.0.dependsOn: ignored: aisched starts a job's tasks together",
            *(
                f"v.yaml: spec.plugins.{p}: ignored: aisched sets its own environment in every "
                "task (AISCHED_TASK_INDEX, MASTER_ADDR, WORLD_SIZE, RANK...; see docs/jobs.md)"
                for p in ("ssh", "svc", "env")
            ),
            "v.yaml: spec.volumes: ignored: aisched mounts only a pod's own hostPath volumes",
            "v.yaml: spec.networkTopology: ignored: use a native job file's topology "
            "(pack/spread) instead",
        ),
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", VOLCANO_VALID, ids=lambda c: c.name)
def test_volcano_valid(case: Valid) -> None:
    assert parse_job_document(case.doc, "v.yaml") == ParsedJob(case.want, "volcano", case.warnings)


def _policies(
    job_policies: list[dict[str, Any]],
    task_policies: list[dict[str, Any]],
    restart_policies: list[str | None],
) -> dict[str, Any]:
    tasks = []
    for i, rp in enumerate(restart_policies):
        t = task(f"t{i}", image=None, pod={"restartPolicy": rp} if rp else {})
        if i == 0 and task_policies:
            t["policies"] = task_policies
        tasks.append(t)
    return vc(*tasks, policies=job_policies)


ON_FAILURE, NEVER, ALWAYS = RestartPolicy.ON_FAILURE, RestartPolicy.NEVER, RestartPolicy.ALWAYS
RESTART_MAP: list[tuple[str, dict[str, Any], RestartPolicy, tuple[str, ...]]] = [
    ("nothing said", _policies([], [], [None]), ON_FAILURE, ()),
    ("pods never restart", _policies([], [], ["Never", "Never"]), NEVER, ()),
    ("pods always restart", _policies([], [], ["Always"]), ALWAYS, ()),
    ("pods restart on failure", _policies([], [], ["OnFailure"]), ON_FAILURE, ()),
    (
        "pods differ",
        _policies([], [], ["Never", "Always"]),
        ON_FAILURE,
        ("v.yaml: spec.tasks: the tasks' restartPolicy differ (or some give none); aisched "
         "restarts the whole job on failure",),
    ),
    # A task that says nothing is not one that says Never (or Always): it was left out, and
    # one task's Never (or Always) became the job's, without a word.
    (
        "one pod never restarts, the other says nothing",
        _policies([], [], ["Never", None]),
        ON_FAILURE,
        ("v.yaml: spec.tasks: the tasks' restartPolicy differ (or some give none); aisched "
         "restarts the whole job on failure",),
    ),
    (
        "one pod always restarts, the other says nothing",
        _policies([], [], [None, "Always"]),
        ON_FAILURE,
        ("v.yaml: spec.tasks: the tasks' restartPolicy differ (or some give none); aisched "
         "restarts the whole job on failure",),
    ),
    (
        "PodFailed -> RestartJob beats pods that never restart",
        _policies([{"event": "PodFailed", "action": "RestartJob"}], [], ["Never"]),
        ON_FAILURE,
        (),
    ),
    (
        "any event, in a task's policies",
        _policies([], [{"events": ["*"], "action": "RestartJob"}], ["Never"]),
        ON_FAILURE,
        (),
    ),
    (
        "a restart of one task restarts the job",
        _policies([{"event": "TaskFailed", "action": "RestartTask"}], [], ["Never"]),
        ON_FAILURE,
        ("v.yaml: spec.policies.0.action: RestartTask: aisched restarts the whole job",),
    ),
    (
        "an exit code",
        _policies([{"exitCode": 3, "action": "RestartJob"}], [], ["Never"]),
        ON_FAILURE,
        ("v.yaml: spec.policies.0.exitCode: aisched restarts on any failure, not only on exit "
         "code 3",),
    ),
    (
        "PodFailed -> AbortJob",
        _policies([{"event": "PodFailed", "action": "AbortJob"}], [], ["OnFailure"]),
        NEVER,
        (),
    ),
    (
        "PodEvicted -> RestartJob says nothing about failures",
        _policies([{"event": "PodEvicted", "action": "RestartJob"}], [], ["Never"]),
        NEVER,
        (),
    ),
    (
        "TaskCompleted -> CompleteJob is ignored",
        _policies([], [{"event": "TaskCompleted", "action": "CompleteJob"}], ["OnFailure"]),
        ON_FAILURE,
        ("v.yaml: spec.tasks.0.policies.0: ignored: aisched does not act on TaskCompleted -> "
         "CompleteJob",),
    ),
    (
        "unknown names are ignored",
        _policies([{"event": "PodFailled", "action": "RestartJob"}], [], ["Never"]),
        NEVER,
        ("v.yaml: spec.policies.0: ignored: PodFailled unknown to aisched",),
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "want", "warnings"), [c[1:] for c in RESTART_MAP], ids=[c[0] for c in RESTART_MAP]
)
def test_volcano_restart_mapping(
    doc: dict[str, Any], want: RestartPolicy, warnings: tuple[str, ...]
) -> None:
    got = parse_job_document(doc, "v.yaml")
    assert (got.job.restart_policy, got.warnings) == (want, warnings)


VOLCANO_INVALID = [
    Invalid("another apiVersion", {**vc(), "apiVersion": "batch/v1"},
            ["v.yaml: apiVersion: 'batch/v1' is not accepted; aisched reads Volcano Jobs "
             "(apiVersion: batch.volcano.sh/v1alpha1, kind: Job) and native job files (no "
             "apiVersion)"]),
    Invalid("another kind", {**vc(), "kind": "CronJob"},
            ["v.yaml: kind: batch.volcano.sh/v1alpha1 'CronJob' is not accepted; aisched reads "
             "Volcano Jobs (apiVersion: batch.volcano.sh/v1alpha1, kind: Job) and native job "
             "files (no apiVersion)"]),
    Invalid("no name", {**vc(), "metadata": {"namespace": "ns", "generateName": "x-"}},
            ["v.yaml: metadata.name: Field required"]),
    Invalid("no spec", {k: v for k, v in vc().items() if k != "spec"},
            ["v.yaml: spec: Field required"]),
    Invalid("no tasks", vc(tasks=[]) | {"spec": {"tasks": []}},
            ["v.yaml: spec.tasks: a job needs at least one task"]),
    Invalid("args without a command", vc(task(command=None, args=["x.py"])),
            [f"v.yaml: {C0}.command: required: aisched runs a command, and the image's "
             "entrypoint is not known (args alone are not enough)"]),
    Invalid("no command", vc(task(command=None)),
            [f"v.yaml: {C0}.command: required: aisched runs a command, and the image's "
             "entrypoint is not known"]),
    Invalid("a command given as a string", vc(task(command="python x.py")),
            [f"v.yaml: {C0}.command: expected a list, got 'python x.py' (a string)"]),
    Invalid("two containers", vc({"name": "w", "template": {"spec": {"containers": [
                {"command": ["a"], "resources": {"limits": {"cpu": "lots"}}},
                {"command": ["b"]}]}}}),
            [f"v.yaml: {C0}.resources.limits.cpu: 'lots' is not a Kubernetes quantity (e.g. 8Gi, "
             "512Mi, 500m, 2)",
             "v.yaml: spec.tasks.0.template.spec.containers: aisched runs one process per task; "
             "this task has 2 containers (make each its own task, or start them all from one "
             "command)"]),
    Invalid("no container", vc({"name": "w", "template": {"spec": {"containers": []}}}),
            ["v.yaml: spec.tasks.0.template.spec.containers: a task needs one container with a "
             "command"]),
    Invalid("valueFrom and envFrom", vc(task(
                env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                envFrom=[{"configMapRef": {"name": "cm"}}])),
            [f"v.yaml: {C0}.env.0.valueFrom: aisched cannot read ConfigMaps, Secrets or pod "
             "fields: give the value itself",
             f"v.yaml: {C0}.envFrom: aisched cannot read ConfigMaps or Secrets: list each "
             "variable under env with its value"]),
    Invalid("env the scheduler sets, env set twice",
            vc(task(env=[{"name": "RANK", "value": "0"}, {"name": "A", "value": "1"},
                         {"name": "A", "value": "2"}])),
            [f"v.yaml: {C0}.env.0.name: set by the scheduler; cannot be overridden"]),
    Invalid("env set twice", vc(task(env=[{"name": "A", "value": "1"}, {"name": "A"}])),
            [f"v.yaml: {C0}.env.1.name: 'A' is already set by env.0"]),
    Invalid("a fraction of nvidia.com/gpu",
            vc(task(resources={"limits": {"nvidia.com/gpu": "0.5"}})),
            [f"v.yaml: {C0}.resources.limits.nvidia.com/gpu: 0.5 is not a whole number "
             "(extended resources are counted whole)"]),
    Invalid("absurd resources", vc(task(resources={"limits": {
                "cpu": "200k", "memory": "2Pi", "nvidia.com/gpu": 5000}})),
            [f"v.yaml: {C0}.resources.limits.cpu: 200k is more than the limit of 100,000 CPUs",
             f"v.yaml: {C0}.resources.limits.memory: 2Pi is more than the limit of 1Pi",
             f"v.yaml: {C0}.resources.limits.nvidia.com/gpu: 5000 is more than the limit of 4096 "
             "GPUs per task"]),
    Invalid("zero cpu", vc(task(resources={"requests": {"cpu": "0"}})),
            [f"v.yaml: {C0}.resources.requests.cpu: must be more than 0"]),
    Invalid("unknown priority class", vc(priorityClassName="system-node-critical"),
            ["v.yaml: spec.priorityClassName: unknown priority class 'system-node-critical'; "
             f"known: {KNOWN_CLASSES}"]),
    Invalid("minAvailable above the tasks", vc(task(replicas=2), minAvailable=3),
            ["v.yaml: spec.minAvailable: 3 is more than the job's 2 tasks"]),
    Invalid("a task's minAvailable above its replicas",
            vc(task(replicas=2, task={"minAvailable": 3})),
            ["v.yaml: spec.tasks.0.minAvailable: 3 is more than the task's 2 replicas"]),
    Invalid("a container's workingDir is a path inside its image: absolute",
            vc(task(workingDir="data")),
            [f"v.yaml: {C0}.workingDir: 'data': give an absolute path inside the image"]),
    Invalid("requests above limits, as Kubernetes refuses them",
            vc(task(resources={"requests": {"cpu": 2, "memory": "2Gi", "nvidia.com/gpu": 2},
                               "limits": {"cpu": "1500m", "memory": "1Gi", "nvidia.com/gpu": 1}})),
            [f"v.yaml: {C0}.resources.requests.cpu: 2 is more than its limit (1.5): a request "
             "must be less than or equal to the limit",
             f"v.yaml: {C0}.resources.requests.memory: 2048Mi is more than its limit (1024Mi): "
             "a request must be less than or equal to the limit",
             f"v.yaml: {C0}.resources.requests.nvidia.com/gpu: 2 is more than its limit (1): a "
             "request must be less than or equal to the limit"]),
    Invalid("a queue label that is no queue name",
            {**vc(task()), "metadata": {"name": "vj", "labels": {"kai.scheduler/queue": "a b"}}},
            ["v.yaml: metadata.labels.kai.scheduler/queue: 'a b' is not a valid name: 1 to 63 "
             "letters, digits, '.', '_' or '-', starting with a letter or digit"]),
    Invalid("a preemptable label that is no boolean",
            {**vc(task()), "metadata": {"name": "vj",
                                        "labels": {"volcano.sh/preemptable": "no"}}},
            ["v.yaml: metadata.labels.volcano.sh/preemptable: expected \"true\" or \"false\", "
             "got 'no' (a string)"]),
    Invalid("task names repeat", vc(task("a"), task("a")),
            ["v.yaml: spec.tasks.1.name: 'a' is already the name of spec.tasks.0"]),
    Invalid("zero replicas", vc(task(replicas=0)),
            ["v.yaml: spec.tasks.0.replicas: must be at least 1, got 0"]),
    Invalid("maxRetry of the wrong type", vc(maxRetry="3"),
            ["v.yaml: spec.maxRetry: expected an integer, got '3' (a string)"]),
    Invalid("bad grace period", vc(task(pod={"terminationGracePeriodSeconds": 7200})),
            ["v.yaml: spec.tasks.0.template.spec.terminationGracePeriodSeconds: must be at most "
             "3,600, got 7200"]),
    Invalid("bad restartPolicy", vc(task(pod={"restartPolicy": "Sometimes"})),
            ["v.yaml: spec.tasks.0.template.spec.restartPolicy: expected 'Always', "
             "'OnFailure' or 'Never', got 'Sometimes' (a string)"]),
    Invalid("preemptable not a boolean", {**vc(), "metadata": {
                "name": "vj", "annotations": {"volcano.sh/preemptable": "maybe"}}},
            ["v.yaml: metadata.annotations.volcano.sh/preemptable: expected \"true\" or "
             "\"false\", got 'maybe' (a string)"]),
    Invalid("a bad job name", vc(name="x" * 64),
            [f"v.yaml: metadata.name: '{'x' * 64}' is not a valid name: 1 to 63 letters, digits, "
             "'.', '_' or '-', starting with a letter or digit"]),
]  # fmt: skip


@pytest.mark.parametrize("case", VOLCANO_INVALID, ids=lambda c: c.name)
def test_volcano_errors(case: Invalid) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_document(case.doc, "v.yaml")
    assert list(info.value.problems) == case.want


def test_what_dollar_names_make_too_large_to_start_is_refused_at_its_field() -> None:
    """Each word and value was checked as written: `$(A)$(A)` of a 100,000-byte A passed, and
    the task failed at its start with exec's `Argument list too long`, said of the program."""
    big = "x" * 100_000
    env = [{"name": "A", "value": big}, {"name": "B", "value": "$(A)$(A)"}]
    doc = vc(task(command=["sh", "-c", "$(A)$(A)"], args=["ok", "$(A)$(B)"], env=env))
    with pytest.raises(SpecError) as info:
        parse_job_document(doc, "v.yaml")
    word = (
        "bytes once $(NAME) is expanded: a program gets at most 130,048 bytes in each "
        "argument or variable (the kernel's limit)"
    )
    assert list(info.value.problems) == [
        f"v.yaml: {C0}.env.1.value: is 200,000 {word}",
        f"v.yaml: {C0}.command.2: is 200,000 {word}",
        f"v.yaml: {C0}.args.1: is 300,000 {word}",
    ]
    # Many words each under the limit, together over it.
    many = vc(task(command=["echo", *["$(A)"] * 11], env=env[:1]))
    with pytest.raises(SpecError) as info:
        parse_job_document(many, "v.yaml")
    assert list(info.value.problems) == [
        f"v.yaml: {C0}: the command and its environment are 1,200,019 bytes once $(NAME) is "
        "expanded: a program gets at most 1,048,576 bytes of them"
    ]
    # Names the scheduler sets are known at the launch only: checked there (test_loop).
    parse_job_document(
        vc(task(command=["echo", "$(RANK)" * 10_000, "$(A)"], env=env[:1])), "v.yaml"
    )


# --- example files --------------------------------------------------------------------------

PYTORCH = ContainerSpec("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", workdir_in_image=True)
EXAMPLE_JOBS = {
    "shared-infer.yaml": ParsedJob(
        job(
            group(
                replicas=2,
                command=("/bin/sh", "-c", "python serve.py --port 8080"),
                cpu=2000,
                mem=8 * GIB,
                gpu_milli=330,
                gpu_mem=10 * GIB,
            ),
            name="embed-service",
            kind=JobKind.INFER,
            gpu_models=("A100", "A10"),
            gpu_models_preferred=("A10",),
        ),
        "native",
    ),
    "hello.yaml": ParsedJob(
        job(
            group(
                command=(
                    "/bin/sh",
                    "-c",
                    'echo "hello from task $AISCHED_TASK of job $AISCHED_JOB_ID"',
                )
            ),
            name="echo",
        ),
        "native",
    ),
    "train.yaml": ParsedJob(
        Job(
            id="",
            groups=(
                group(
                    "worker",
                    4,
                    ("python", "train.py", "--config", "configs/llm-7b.yaml"),
                    cpu=16000,
                    mem=128 * GIB,
                    gpu=2,
                    gpu_mem=80 * GIB,
                    env=(("NCCL_DEBUG", "WARN"), ("HF_HOME", "/srv/cache/huggingface")),
                ),
            ),
            name="train-llm",
            kind=JobKind.TRAIN,
            queue="research",
            priority=100,
            topology=TopologyRequirement(pack=TopologyLevel.RACK),
            gpu_models=("A100", "H100"),
            max_retries=5,
            time_limit_s=12 * 3600.0,
            estimate_s=8 * 3600.0,
            checkpoint_interval_s=1800.0,
            grace_period_s=120.0,
            backoff_s=30.0,
        ),
        "native",
    ),
    "volcano-pytorch.yaml": ParsedJob(
        Job(
            id="",
            groups=(
                group(
                    "master",
                    1,
                    ("python", "/opt/mnist/main.py", "--epochs", "10", "--backend", "nccl"),
                    cpu=4000,
                    mem=16 * GIB,
                    gpu=1,
                    env=(("NCCL_DEBUG", "INFO"),),
                    workdir="/opt/mnist",
                    container=PYTORCH,
                    kubernetes_pod=True,
                ),
                group(
                    "worker",
                    2,
                    ("python", "/opt/mnist/main.py", "--epochs", "10", "--backend", "nccl"),
                    cpu=3500,  # from requests: the limits give no cpu
                    mem=16 * GIB,  # from limits, over requests' 12Gi
                    gpu=2,
                    env=(("NCCL_DEBUG", "INFO"),),
                    workdir="/opt/mnist",
                    container=PYTORCH,
                    kubernetes_pod=True,
                ),
            ),
            name="pytorch-mnist",
            kind=JobKind.TRAIN,
            queue="research",
            priority=100,
            max_retries=5,
        ),
        "volcano",
        (
            "volcano-pytorch.yaml: spec.plugins.pytorch: --port=23456 not honoured: MASTER_PORT "
            "is a free port chosen when the job starts (a fixed port would clash between jobs "
            "on one host); read MASTER_PORT",
            "volcano-pytorch.yaml: spec.tasks.0.policies.0: ignored: aisched does not act on "
            "TaskCompleted -> CompleteJob",
        ),
    ),
    "volcano-batch.yaml": ParsedJob(
        Job(
            id="",
            groups=(
                group(
                    "shard",
                    8,
                    (
                        "/bin/sh",
                        "-c",
                        "python preprocess.py --shard ${VC_TASK_INDEX:-$AISCHED_TASK_INDEX} --of 8",
                    ),
                    cpu=2000,
                    mem=4 * GIB,
                    container=ContainerSpec("python:3.11-slim", workdir_in_image=True),
                    kubernetes_pod=True,
                ),
            ),
            name="preprocess-shards",
            queue="batch",
            restart_policy=RestartPolicy.NEVER,
            max_retries=0,
            time_limit_s=3600.0,
            estimate_s=1200.0,
            grace_period_s=10.0,
        ),
        "volcano",
        (
            "volcano-batch.yaml: spec.plugins.env: ignored: aisched sets its own environment in "
            "every task (AISCHED_TASK_INDEX, MASTER_ADDR, WORLD_SIZE, RANK...; see docs/jobs.md)",
        ),
    ),
}


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(EXAMPLE_JOBS)


@pytest.mark.parametrize("name", sorted(EXAMPLE_JOBS))
def test_example_files(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES)
    assert load_job_file(name) == EXAMPLE_JOBS[name]


# --- text and files -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("command: [python, x.py\nreplicas: 2\n", "j.yaml:2:9: YAML syntax error: "),
        ("command: x\nname: a\ncommand: y\n", "j.yaml:3:1: YAML syntax error: key 'command' "),
        ("\tcommand: x\n", "j.yaml:1:1: YAML syntax error: "),
        ("command: x\n---\ncommand: y\n", "j.yaml:2:1: YAML syntax error: "),
        ('{"command": ["x"] "replicas": 2}', "j.yaml:1:19: YAML syntax error: expected ','"),
        (
            "replicas: " + "9" * 5000,
            f"j.yaml:1:11: YAML syntax error: '{'9' * 36}...' cannot be read as !!int: Exceeds "
            "the limit",
        ),
    ],
)
def test_yaml_errors_give_line_and_column(text: str, want: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_text(text, "j.yaml")
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(want)


def test_yaml_nested_too_deeply_says_where_the_reader_had_got_to() -> None:
    """Where the stack ran out depends on how deep the caller's own stack is, so the column
    is not fixed; the line is where the nesting is."""
    with pytest.raises(SpecError) as info:
        parse_job_text("command: x\nenv: " + "[" * 1500 + "]" * 1500, "j.yaml")
    assert len(info.value.problems) == 1
    assert re.fullmatch(r"j\.yaml:2:\d+: YAML error: nested too deeply", info.value.problems[0])


def test_a_real_file_and_an_unreadable_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("job.yaml").write_text("# comment\ncommand: [python, x.py]\nresources:\n  gpus: two\n")
    with pytest.raises(SpecError) as info:
        load_job_file("job.yaml")
    assert info.value.problems == (
        "job.yaml: resources.gpus: 'two' is not a GPU count: give e.g. 1, 4 or 0.5",
    )
    with pytest.raises(SpecError, match=r"^missing\.yaml: cannot read: "):
        load_job_file("missing.yaml")
    Path("bin.yaml").write_bytes(b"command: \xff\xfe\n")
    with pytest.raises(SpecError, match=r"^bin\.yaml: not UTF-8 text: "):
        load_job_file("bin.yaml")


def test_a_cyclic_document_is_an_error() -> None:
    with pytest.raises(SpecError):
        parse_job_text("command: &c [python, *c]\n", "j.yaml")


# --- junk never escapes as anything but a SpecError -----------------------------------------

# The keys of both formats, so that junk often reaches deep into a document.
KEYS = (
    "name", "kind", "queue", "user", "priority", "priority_class", "preemptible",
    "min_available", "gpu_models", "topology", "pack", "spread", "mode", "restart", "policy",
    "max_retries", "backoff", "time_limit", "estimate", "checkpoint_interval", "grace_period",
    "tasks", "command", "replicas", "resources", "cpus", "mem", "gpus", "gpu_mem", "env",
    "gpu_milli", "required", "preferred",
    "workdir", "apiVersion", "metadata", "spec", "minAvailable", "priorityClassName", "maxRetry",
    "runningEstimate", "policies", "plugins", "template", "containers", "image", "args",
    "workingDir", "limits", "requests", "cpu", "memory", "nvidia.com/gpu", "value", "valueFrom",
    "envFrom", "restartPolicy", "event", "events", "action", "exitCode", "annotations",
    "volcano.sh/preemptable", "activeDeadlineSeconds", "terminationGracePeriodSeconds",
    "initContainers", "volumes", "nodeSelector",
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(
        ["batch.volcano.sh/v1alpha1", "Job", "train", "8G", "8Gi", "500m", "0.5", "1h30m",
         "PodFailed", "RestartJob", "Never", "high", "rack", "false", "1e999", "RANK"]
    ),
)  # fmt: skip
JUNK = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), SCALARS), inner, max_size=5),
    ),
    max_leaves=30,
)
VALID_DOCS = [c.doc for c in NATIVE_VALID + VOLCANO_VALID] + [
    yaml.safe_load((EXAMPLES / name).read_text()) for name in sorted(EXAMPLE_JOBS)
]


def _nodes(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _nodes(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _nodes(v, (*path, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    doc = copy.deepcopy(doc)
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return doc


def _parses_or_says_why(doc: Any) -> None:
    try:
        got = parse_job_document(doc, "junk.yaml")
    except SpecError as e:
        assert e.problems and all(p.startswith("junk.yaml") for p in e.problems)
    else:
        assert got.job.id == "" and got.format in ("native", "volcano")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JUNK)
def test_junk_documents(doc: Any) -> None:
    _parses_or_says_why(doc)
    _parses_or_says_why({"tasks": doc})
    _parses_or_says_why(vc() | {"spec": doc})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_valid_documents_with_one_part_replaced_by_junk(data: st.DataObject) -> None:
    doc = data.draw(st.sampled_from(VALID_DOCS))
    path = data.draw(st.sampled_from(_nodes(doc)))
    _parses_or_says_why(_replace(doc, path, data.draw(JUNK)))


# Text made of YAML's punctuation, tags and a few keys reaches the parser's corners that
# random text seldom does.
YAMLISH = st.lists(
    st.sampled_from([*"{}[]?:,-&*!|>'\"#%@` \n\tax01.", "tasks", "gpu", "!!int", "!!timestamp"]),
    max_size=60,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(YAMLISH, st.text(max_size=200)))
@example("{{}}")  # a mapping as a key once raised TypeError
@example("!!timestamp")  # a value that does not fit its tag once raised AttributeError
def test_junk_text(text: str) -> None:
    with contextlib.suppress(SpecError):
        parse_job_text(text, "junk.yaml")


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("{{}}", "1:2", "dict"),
        ("? [1, 2]\n: x\n", "1:3", "list"),
        ("name: a\ntasks:\n  {a: 1}: 2\n", "3:3", "dict"),
    ],
)
def test_a_key_that_is_a_list_or_mapping_is_refused_with_its_place(
    text: str, where: str, what: str
) -> None:
    with pytest.raises(SpecError) as e:
        parse_job_text(text, "junk.yaml")
    assert (
        str(e.value)
        == f"junk.yaml:{where}: YAML syntax error: a key must be a plain value, not a {what}"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("!!timestamp", "1:1: YAML syntax error: '' cannot be read as !!timestamp"),
        (
            "a: !!timestamp 2020-13-45",
            "1:4: YAML syntax error: '2020-13-45' cannot be read as !!timestamp: month must be "
            "in 1..12",
        ),
        (
            "name: a\ntasks:\n  - gpu: !!int two\n",
            "3:10: YAML syntax error: 'two' cannot be read as !!int: invalid literal for int() "
            "with base 10: 'two'",
        ),
    ],
)
def test_a_value_that_does_not_fit_its_tag_is_refused_with_its_place(
    text: str, message: str
) -> None:
    with pytest.raises(SpecError) as e:
        parse_job_text(text, "junk.yaml")
    assert str(e.value) == f"junk.yaml:{message}"


# --- containers -----------------------------------------------------------------------------

CONTAINER_VALID = [
    Valid(
        "an image on the one-task shorthand, with every container field",
        {**CMD, "image": "localhost/trainer:1", "bandwidth": "10Mbit", "shm_size": "1G",
         "volumes": [{"host_path": "/datasets", "path": "/data", "read_only": True},
                     {"host_path": "/scratch"}]},
        job(group(container=ContainerSpec(
            "localhost/trainer:1", network=NetworkMode.BRIDGE, bandwidth_bit_s=10_000_000,
            shm_mib=1024,
            volumes=(Volume("/datasets", "/data", True), Volume("/scratch", "/scratch")),
        ))),
    ),
    Valid(
        "a job's image is every task's default; a task's own fields win",
        {"image": "a:1", "network": "none", "tasks": [
            {"name": "w", "command": ["python", "x.py"]},
            {"name": "ps", "command": ["python", "x.py"], "image": "b:2", "network": "host"},
        ]},
        job(group("w", container=ContainerSpec("a:1", network=NetworkMode.NONE)),
            group("ps", container=ContainerSpec("b:2"))),
    ),
    Valid("rates in tc's words", {**CMD, "image": "a", "bandwidth": "1.5Gbit"},
          job(group(container=ContainerSpec("a", network=NetworkMode.BRIDGE,
                                            bandwidth_bit_s=1_500_000_000)))),
    Valid("the largest rate, in bits per second", {**CMD, "image": "a", "bandwidth": "10Tbit/s"},
          job(group(container=ContainerSpec("a", network=NetworkMode.BRIDGE,
                                            bandwidth_bit_s=10**13)))),
]  # fmt: skip


@pytest.mark.parametrize("case", CONTAINER_VALID, ids=lambda c: c.name)
def test_container_fields(case: Valid) -> None:
    assert parse_job_document(case.doc, "j.yaml") == ParsedJob(case.want, "native", case.warnings)


CONTAINER_INVALID = [
    Invalid("container fields without an image",
            {**CMD, "network": "bridge", "shm_size": "1G", "volumes": [{"host_path": "/d"}]},
            ["j.yaml: network: needs an image: only a container task has one",
             "j.yaml: shm_size: needs an image: only a container task has one",
             "j.yaml: volumes: needs an image: only a container task has one"]),
    Invalid("shaping on the host's network", {**CMD, "image": "a", "network": "host",
                                               "bandwidth": "1Gbit"},
            ["j.yaml: bandwidth: needs network: bridge (traffic is shaped on the container's "
             "own interface; network host has none)"]),
    Invalid("a bad image, rate, path and network",
            {**CMD, "image": "Not An Image", "bandwidth": "fast", "network": "overlay",
             "volumes": [{"host_path": "data"}]},
            ["j.yaml: image: 'Not An Image' is not an image reference such as python:3.11, "
             "nvcr.io/nvidia/pytorch:24.01-py3 or localhost/mine@sha256:...",
             "j.yaml: network: expected 'host', 'none' or 'bridge', got 'overlay' (a string)",
             "j.yaml: bandwidth: 'fast' is not a rate such as 10Mbit or 1Gbit",
             "j.yaml: volumes.0.host_path: 'data' must be an absolute path"]),
    Invalid("a rate too small", {**CMD, "image": "a", "bandwidth": "1kbit"},
            ["j.yaml: bandwidth: '1kbit' is below the least shapeable rate of 8kbit"]),
    # tc reads `mbps` as megabytes per second: 10mbps had been 10 Mbit/s, a surprise either way.
    Invalid("a rate in bps", {**CMD, "image": "a", "bandwidth": "10mbps"},
            ["j.yaml: bandwidth: '10mbps': bps is ambiguous (tc reads it as bytes per second, "
             "most people as bits): write bits per second, such as 10Mbit"]),
    Invalid("a rate past the limit", {**CMD, "image": "a", "bandwidth": "10.5Tbit"},
            ["j.yaml: bandwidth: '10.5Tbit' is more than the limit of 10Tbit"]),
    # Read through a float it was infinity, and `int` of it raised OverflowError.
    Invalid("a rate of 401 digits", {**CMD, "image": "a", "bandwidth": "1" + "0" * 400},
            [f"j.yaml: bandwidth: '1{'0' * 34}...' is more than the limit of 10Tbit"]),
    Invalid("two volumes on one path", {**CMD, "image": "a", "volumes": [
                {"host_path": "/a", "path": "/d"}, {"host_path": "/b", "path": "/d"}]},
            ["j.yaml: volumes.1: mounts on /d, as volumes.0"]),
    # `/mnt:U` made rootful podman chown the host path to the job's user.
    Invalid("mount options smuggled into a volume's paths", {**CMD, "image": "a", "volumes": [
                {"host_path": "/tmp/rootdir", "path": "/mnt:U"},
                {"host_path": "/srv/a:ro,U", "path": "/a"},
                {"host_path": "/srv/b,U"}]},
            ["j.yaml: volumes.0.path: '/mnt:U' holds a ':', which the container engine would "
             "read as mount options: a mounted path may hold neither ':' nor ','",
             "j.yaml: volumes.1.host_path: '/srv/a:ro,U' holds a ':', which the container "
             "engine would read as mount options: a mounted path may hold neither ':' nor ','",
             "j.yaml: volumes.2.host_path: '/srv/b,U' holds a ',', which the container engine "
             "would read as mount options: a mounted path may hold neither ':' nor ','"]),
    # An env file holds one line a variable; on podman's command line the value is every
    # local user's to read, and podman's own environment is root's.
    Invalid("a container's variable with a line break",
            {"tasks": [{"name": "w", "command": "true", "image": "a",
                        "env": {"KEY": "-----BEGIN\nKEY-----", "OK": "one line"}}]},
            ["j.yaml: tasks.0.env.KEY: a container task's variable cannot hold a line break; "
             "encode the value (base64, for instance) or put it in a file the task reads"]),
    Invalid("the same, written short",
            {**CMD, "image": "a", "env": {"KEY": "a\rb"}},
            ["j.yaml: env.KEY: a container task's variable cannot hold a line break; "
             "encode the value (base64, for instance) or put it in a file the task reads"]),
    Invalid("an image behind a transport",
            {**CMD, "image": "docker-archive:/home/u/evil.tar"},
            ["j.yaml: image: 'docker-archive:/home/u/evil.tar' names the image transport "
             "'docker-archive', which loads an image from a file, a directory or another store "
             "with the engine's rights: give a registry reference such as python:3.11 or "
             "nvcr.io/nvidia/pytorch:24.01-py3"]),
]  # fmt: skip


@pytest.mark.parametrize("case", CONTAINER_INVALID, ids=lambda c: c.name)
def test_container_errors(case: Invalid) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_document(case.doc, "j.yaml")
    assert list(info.value.problems) == case.want


@pytest.mark.parametrize(
    "image",
    ["python:3.11", "busybox", "nvcr.io/nvidia/pytorch:24.01-py3", "localhost/aisched-test:TAG",
     "localhost:5000/team/trainer:v1.2_rc-3", "[::1]:5000/x", "docker.io/library/oci:1",
     f"localhost/mine@sha256:{'a' * 64}", f"python:3.11@sha256:{'0' * 64}", "a_b__c-d---e.f/g"],
)  # fmt: skip
def test_a_registry_reference_is_an_image(image: str) -> None:
    parsed = parse_job_document({**CMD, "image": image}, "j.yaml")
    assert parsed.job.groups[0].container == ContainerSpec(image)


# Every transport of containers-image, in the forms podman takes them; some (`oci:x`, `dir:x`,
# `containers-storage:x`) fit the reference grammar, as a name and a tag.
@pytest.mark.parametrize(
    "image",
    ["docker-archive:/home/u/evil.tar", "oci-archive:/root-only/img.tar", "dir:/srv/img",
     "dir:img", "containers-storage:busybox", "docker-daemon:busybox:latest", "oci:layout",
     "sif:/x.sif", "ostree:img@/ostree/repo", "tarball:/x.tar",
     "atomic:x/y:1", "openshift:x", "Docker-Archive:/x.tar"],
)  # fmt: skip
def test_an_image_transport_is_refused(image: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_document({**CMD, "image": image}, "j.yaml")
    assert list(info.value.problems) == [
        f"j.yaml: image: {image!r} names the image transport {image.partition(':')[0]!r}, "
        "which loads an image from a file, a directory or another store with the engine's "
        "rights: give a registry reference such as python:3.11 or "
        "nvcr.io/nvidia/pytorch:24.01-py3"
    ]


@pytest.mark.parametrize("image", ["docker://busybox", "DOCKER:busybox:1"])
def test_the_registry_transport_is_refused_naming_the_reference_alone(image: str) -> None:
    """`docker://` pulls from a registry: it was told it loads from a file or a store."""
    with pytest.raises(SpecError) as info:
        parse_job_document({**CMD, "image": image}, "j.yaml")
    alone = image.split(":", 1)[1].lstrip("/")
    assert list(info.value.problems) == [
        f"j.yaml: image: {image!r}: leave out the transport (give {alone!r}): a reference "
        "alone is pulled from a registry"
    ]


@pytest.mark.parametrize(
    "image",
    ["Python:3.11", "a//b", "-a", "a:b:c", "a@sha256:abc", "a:-tag", "a/B", "a b", "a/:1",
     "a:" + "t" * 129, "localhost:port/x"],
)  # fmt: skip
def test_what_is_no_reference_is_refused(image: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_document({**CMD, "image": image}, "j.yaml")
    assert list(info.value.problems) == [
        f"j.yaml: image: {image!r} is not an image reference such as python:3.11, "
        "nvcr.io/nvidia/pytorch:24.01-py3 or localhost/mine@sha256:..."
    ]


def test_a_volcano_mount_may_not_carry_mount_options() -> None:
    doc = vc(task(
        volumeMounts=[{"name": "data", "mountPath": "/data:U"}],
        pod={"volumes": [{"name": "data", "hostPath": {"path": "/srv/data,U"}}]},
    ))  # fmt: skip
    with pytest.raises(SpecError) as info:
        parse_job_document(doc, "v.yaml")
    assert sorted(info.value.problems) == [
        f"v.yaml: {C0}.volumeMounts.0.mountPath: '/data:U' holds a ':', which the container "
        "engine would read as mount options: a mounted path may hold neither ':' nor ','",
        "v.yaml: spec.tasks.0.template.spec.volumes.0.hostPath.path: '/srv/data,U' holds a "
        "',', which the container engine would read as mount options: a mounted path may "
        "hold neither ':' nor ','",
    ]


def test_a_volcano_container_variable_may_not_hold_a_line_break() -> None:
    doc = vc(task(env=[{"name": "KEY", "value": "two\nlines"}]))
    with pytest.raises(SpecError) as info:
        parse_job_document(doc, "v.yaml")
    assert list(info.value.problems) == [
        f"v.yaml: {C0}.env.0.value: a container task's variable cannot hold a line break; "
        "encode the value (base64, for instance) or put it in a file the task reads"
    ]
    # On the host a task gets its environment whole: a line break is fine there.
    parse_job_document({**CMD, "env": {"KEY": "two\nlines"}}, "j.yaml")


@pytest.mark.parametrize(
    ("plugin", "want_order"),
    [
        (["--master=m", "--worker=w"], ["m", "w", "x"]),
        (["-master", "m", "-worker", "w"], ["m", "w", "x"]),  # Go's flag forms
        ([], ["w", "x", "m"]),  # no task named `master`: the plugin does nothing
        (["--master=m", "--worker=nope"], ["w", "x", "m"]),
    ],
)
def test_the_pytorch_plugins_master_task_comes_first_in_rank_order(
    plugin: list[str], want_order: list[str]
) -> None:
    doc = vc(task("w", replicas=2), task("x"), task("m"), plugins={"pytorch": plugin})
    got = parse_job_document(doc, "v.yaml").job
    assert [g.name for g in got.groups] == want_order
    moved = want_order[0] == "m"
    # Where each stood in the file, for the paths of errors found at submission.
    assert [g.file_index for g in got.groups] == ([2, 0, 1] if moved else [None] * 3)


def test_the_pytorch_plugins_master_task_of_several_replicas_is_refused() -> None:
    """Two master replicas were ranks 0 and 1 and the workers 2 and 3; Volcano's plugin gives
    every master replica RANK 0 and the workers 1 and 2: no order of ranks is the file's."""
    plugin = {"pytorch": ["--master=lead", "--worker=work"]}
    for doc in (
        vc(task("work", replicas=2), task("lead", replicas=2), plugins=plugin),
        vc(task("lead", replicas=2), task("work", replicas=2), plugins=plugin),
    ):
        m = [t["name"] for t in doc["spec"]["tasks"]].index("lead")
        with pytest.raises(SpecError) as info:
            parse_job_document(doc, "v.yaml")
        assert list(info.value.problems) == [
            f"v.yaml: spec.tasks.{m}.replicas: 2 replicas of the pytorch plugin's master task "
            "'lead': it is one process (the plugin gives each replica RANK 0 and its workers "
            "RANK 1 on); give it 1 replica and the others to the worker task 'work'"
        ]
    # Without its worker task the plugin does nothing: the replicas are ranks 0 and 1.
    alone = vc(task("lead", replicas=2), task("x"), plugins=plugin)
    assert [g.replicas for g in parse_job_document(alone, "v.yaml").job.groups] == [2, 1]


def test_the_pytorch_plugins_port_is_warned_about_not_honoured() -> None:
    doc = vc(task("master"), task("worker"), plugins={"pytorch": ["--port=23456"]})
    assert parse_job_document(doc, "v.yaml").warnings == (
        "v.yaml: spec.plugins.pytorch: --port=23456 not honoured: MASTER_PORT is a free port "
        "chosen when the job starts (a fixed port would clash between jobs on one host); read "
        "MASTER_PORT",
    )


def test_a_volcano_pod_with_hostpath_volumes_and_the_bandwidth_annotation() -> None:
    doc = vc(task(
        volumeMounts=[{"name": "data", "mountPath": "/data", "readOnly": True},
                      {"name": "cache", "mountPath": "/cache"}],
        pod={"volumes": [{"name": "data", "hostPath": {"path": "/srv/data"}},
                         {"name": "cache", "emptyDir": {}}]},
    ))  # fmt: skip
    doc["spec"]["tasks"][0]["template"]["metadata"] = {
        "annotations": {
            "kubernetes.io/egress-bandwidth": "10M",
            "kubernetes.io/ingress-bandwidth": "10M",
        }
    }
    spec = ContainerSpec(
        "busybox",
        network=NetworkMode.BRIDGE,
        bandwidth_bit_s=10_000_000,
        volumes=(Volume("/srv/data", "/data", True),),
    )
    assert parse_job_document(doc, "v.yaml") == ParsedJob(
        vjob(group("w", container=spec)),
        "volcano",
        (
            "v.yaml: spec.tasks.0.template.spec.volumes.1: ignored: aisched mounts only "
            "hostPath volumes into a container (cache: emptyDir)",
            "v.yaml: spec.tasks.0.template.metadata.annotations.kubernetes.io/ingress-bandwidth: "
            "ignored: aisched shapes egress only",
        ),
    )


def test_a_volcano_mount_of_an_unlisted_volume_is_an_error() -> None:
    with pytest.raises(SpecError) as info:
        parse_job_document(vc(task(volumeMounts=[{"name": "x", "mountPath": "/x"}])), "v.yaml")
    assert list(info.value.problems) == [
        f"v.yaml: {C0}.volumeMounts.0.name: no volume named 'x' in "
        "spec.tasks.0.template.spec.volumes"
    ]


def test_a_task_may_ask_for_rdma_devices() -> None:
    parsed = parse_job_text("command: x\nresources: {gpus: 1, rdma: 2}\n", "j.yaml")
    assert parsed.job.groups[0].request.rdma == 2
    with pytest.raises(SpecError) as info:
        parse_job_text("command: x\nresources: {rdma: -1}\n", "j.yaml")
    assert list(info.value.problems) == ["j.yaml: resources.rdma: must be at least 0, got -1"]


def test_an_integer_written_bare_reaches_the_program_as_it_was_written() -> None:
    """YAML 1.1 reads `0755` as octal (493), `1:30` as base 60 (90) and `0x10` as 16: a
    command's words and environment values were those decimals, so `chmod 0755 f` ran as
    `chmod 493 f`. A word is now the text as written; a number field still gets the number."""
    text = (
        "name: oct\n"
        "command: [chmod, 0755, 0x10, 007, 1:30, 1_000, +5, 42, -3]\n"
        "env: {UMASK: 022, T: 1:30, N: 7}\n"
        "replicas: 0x2\n"
    )
    (g,) = parse_job_text(text, "j.yaml").job.groups
    assert g.command == ("chmod", "0755", "0x10", "007", "1:30", "1_000", "+5", "42", "-3")
    assert dict(g.env) == {"UMASK": "022", "T": "1:30", "N": "7"}
    assert g.replicas == 2
    with pytest.raises(SpecError) as e:
        parse_job_text("command: 0755\n", "j.yaml")  # a message quotes it as written too
    (problem,) = e.value.problems
    assert problem.endswith("got 0755 (an integer)"), problem


def _service_block(block: str) -> Any:
    """The service of a job of kind service with `block` as its service mapping, or the
    problems that refuse it."""
    text = f"name: s\nkind: service\ncommand: 'sleep 30'\nservice: {block}\n"
    try:
        return parse_job_text(text, "s.yaml").job.service
    except SpecError as e:
        return list(e.problems)


def test_a_service_may_scale_to_zero_with_its_minimum_alone() -> None:
    """`min_replicas: 0` alone was refused, blaming max_replicas (which it did not write): an
    unsaid maximum is the minimum, and at least one."""
    s = _service_block("{min_replicas: 0}")
    assert (s.min_replicas, s.max_replicas) == (0, 1)
    s = _service_block("{min_replicas: 3}")
    assert (s.min_replicas, s.max_replicas) == (3, 3)
    assert _service_block("{min_replicas: 3, max_replicas: 2}") == [
        "s.yaml: service.min_replicas: 3 is more than max_replicas 2"
    ]


def test_only_an_rps_service_may_scale_to_zero() -> None:
    """A latency_ms service at zero was accepted and never got a replica: with none running
    there is no latency to measure, so nothing ever asked for one."""
    assert _service_block("{min_replicas: 0, max_replicas: 2, metric: latency_ms}") == [
        "s.yaml: service.min_replicas: 0 needs metric rps: a latency is measured on a running "
        "replica, so a latency_ms service scaled to zero would never get a replica again; give "
        "at least 1"
    ]
    assert _service_block("{min_replicas: 1, metric: latency_ms}").min_replicas == 1


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        ("{target: true}", "service.target: expected a number, got true (a boolean)"),
        ("{target: .nan}", "service.target: nan is not a finite number"),
        ("{tolerance: .nan}", "service.tolerance: nan is not a finite number"),
        ("{target: '10'}", "service.target: expected a number, got '10' (a string)"),
        (
            "{readiness_path: 'healthz x'}",
            "service.readiness_path: 'healthz x' is not a URL path: it starts with '/' and has "
            "no spaces",
        ),
    ],
)
def test_a_service_block_refuses_what_is_not_its_kind_of_value_by_name(
    block: str, problem: str
) -> None:
    """`target: true` was taken for 1, NaN was "over the limit", a path met a raw pattern."""
    assert _service_block(block) == [f"s.yaml: {problem}"]


def test_volcano_shaping_without_an_image_and_keys_beside_the_object_are_warned_about() -> None:
    """Both were dropped without a word: the bandwidth annotations of a task that runs on the
    host (the native `bandwidth` is refused there), and a native field such as `depends_on`
    written beside a Volcano Job's apiVersion, kind, metadata and spec."""
    t = task(image=None)
    t["template"]["metadata"] = {
        "annotations": {
            "kubernetes.io/egress-bandwidth": "10M",
            "kubernetes.io/ingress-bandwidth": "10M",
        }
    }
    got = parse_job_document({**vc(t), "depends_on": ["1"]}, "v.yaml")
    ap = "spec.tasks.0.template.metadata.annotations"
    shaping = "ignored: traffic is shaped in a container only; this task has no image"
    assert got.warnings == (
        "v.yaml: depends_on: ignored: a Volcano Job has apiVersion, kind, metadata and spec (a "
        "native job file's fields do not apply to it)",
        f"v.yaml: {ap}.kubernetes.io/egress-bandwidth: {shaping}",
        f"v.yaml: {ap}.kubernetes.io/ingress-bandwidth: {shaping}",
    )
    assert got.job.depends_on == () and got.job.groups[0].container is None


def test_a_json_file_that_is_not_json_says_json() -> None:
    """A .json file is read as YAML (JSON is YAML), and its mistakes were "YAML syntax error"."""
    with pytest.raises(SpecError) as e:
        parse_job_text('{"command": ["true"\n', "j.json")
    (problem,) = e.value.problems
    assert problem.startswith("j.json:") and ": JSON syntax error: " in problem, problem
