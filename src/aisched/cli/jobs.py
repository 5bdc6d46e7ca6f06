"""Job commands: `run`, `submit`, `jobs`, `show`, `logs`, `cancel` — clients of the REST API.

`run` builds a native job document from its flags and the command after `--`; like Slurm's
`srun`/`sbatch`, the job runs in the current directory. It sends only the variables named with
`--env NAME[=VALUE]`, or all of them with `--env-all` (sbatch's `--export`): a job's environment
is stored with it, so nothing is sent that was not asked for. `submit` sends a job file as it
is; the service parses it, so errors name the file and field. Output is a readable table, or
JSON with `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from aisched.cli import options
from aisched.cli.client import Client, add_server_option
from aisched.cli.columns import Cell, render
from aisched.cli.consoles import console
from aisched.cli.errors import EXIT_FAILURE, CLIError, NotSent
from aisched.cli.eta import clock, eta_words, waiting_words
from aisched.cli.options import whole
from aisched.cli.printable import TerminalOutput, plain, printable
from aisched.model.resources import describe_mib
from aisched.service.defaults import FOLLOW_STOPPED, MAX_LIST_LIMIT
from aisched.spec.errors import MAX_JOB_FILE, SpecError, read_text_file
from aisched.spec.job_common import (
    MAX_REPLICAS,
    MAX_RETRIES,
    SCHEDULER_ENV,
    SCHEDULER_ENV_PREFIX,
)

# What `run` never exports: names the scheduler sets itself (`_owned`), and shell noise.
_NOISE = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PROMPT_COMMAND"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOBS_HEADER = ("ID", "NAME", "USER", "QUEUE", "PRI", "STATE", "GPUS", "AGE", "WHY / ETA")
# On a terminal, NAME is cut to this: a long name left WHY / ETA a bare "…" at 80 columns.
_NAME_MOST = 20
_STATE_STYLE = {
    "pending": "yellow",
    "running": "green",
    "succeeded": "blue",
    "failed": "red",
    "cancelled": "magenta",
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a command as a job (queued until its resources are free)",
        description="Queue COMMAND as a job. It runs in the current directory once the "
        "resources are free: only its GPUs in CUDA_VISIBLE_DEVICES, pinned to its CPU cores, "
        "its memory bounded, its output in `aisched logs ID`. Of your environment it gets only "
        "the variables named with --env, or all of them with --env-all; otherwise the "
        "service's PATH, LANG and the like.",
    )
    add_server_option(p)
    # Counts are checked by the spec's own parsers (run_document), so `--cpus abc` says what is
    # wrong in the same words as `--mem abc`.
    p.add_argument("--gpus", default="0", help="GPUs per task (a fraction shares one)")
    p.add_argument("--cpus", default="1", help="CPU cores per task, e.g. 2, 0.5 (default 1)")
    p.add_argument("--mem", default="1G", help="memory per task, e.g. 512M, 8G (default 1G)")
    p.add_argument("--gpu-mem", help="GPU memory per task, e.g. 20G")
    p.add_argument(
        "--replicas",
        type=whole(1, MAX_REPLICAS),
        default=1,
        help="tasks, started together (a gang)",
    )
    p.add_argument("--min-available", type=int, help="start with at least this many tasks")
    p.add_argument("--name", help="job name (default: the command's name)")
    p.add_argument("--queue", help="queue (default: default)")
    p.add_argument("--priority", help="an integer, or a priority class such as high or low")
    p.add_argument("--kind", choices=("train", "infer", "batch"), help="workload kind")
    p.add_argument("--restart", choices=("never", "on-failure", "always"), help="restart policy")
    p.add_argument(
        "--max-retries", type=whole(0, MAX_RETRIES), help="retries after failures (default 3)"
    )
    p.add_argument("--time-limit", help="stop the job after this long, e.g. 2h")
    p.add_argument(
        "--estimate",
        help="how long it will run, e.g. 30s (used until 5 jobs of this name have run)",
    )
    p.add_argument("--grace-period", help="SIGTERM to SIGKILL delay when stopped, e.g. 30s")
    p.add_argument("--not-preemptible", action="store_true", help="never preempt this job")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="send a variable: NAME=VALUE, or NAME for its value here (repeatable)",
    )
    p.add_argument(
        "--env-all", action="store_true", help="send your whole environment (like --export=ALL)"
    )
    # The old default was to send everything; --no-env is what happens now without flags.
    p.add_argument("--no-env", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help="working directory (default: the current one)")
    p.add_argument(
        "--image", help="run in this OCI image (podman or docker), e.g. python:3.11-slim"
    )
    p.add_argument(
        "--network",
        choices=("host", "bridge", "none"),
        help="the container's network (default host; bridge for --bandwidth)",
    )
    p.add_argument(
        "--bandwidth", help="shape the container's outgoing traffic, e.g. 1Gbit (needs bridge)"
    )
    p.add_argument("--shm-size", help="the container's /dev/shm, e.g. 1G (default 64M)")
    p.add_argument(
        "-f", "--follow", action="store_true", help="stream its logs and wait until it ends"
    )
    _add_idempotency_key(p)
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="-- COMMAND [ARGS...], run as given (no shell); one quoted word with spaces or "
        "shell syntax, e.g. 'A=1 python t.py | tee log', is run with /bin/sh -c",
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("submit", help="submit job files (native YAML or Volcano Jobs)")
    add_server_option(p)
    p.add_argument(
        "files", nargs="+", metavar="FILE", help="job files, in order; - reads standard input"
    )
    p.add_argument(
        "-f", "--follow", action="store_true", help="stream its logs and wait until it ends"
    )
    _add_idempotency_key(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("jobs", help="list jobs (live ones unless --all or --state)")
    add_server_option(p)
    p.add_argument("-a", "--all", action="store_true", help="include finished jobs")
    p.add_argument("--state", help="comma-separated states, e.g. pending,running")
    p.add_argument("--queue", help="only this queue")
    p.add_argument("--user", help="only this user")
    p.add_argument(
        "--limit",
        type=whole(1, MAX_LIST_LIMIT),
        default=1000,
        help="at most this many (newest first)",
    )
    p.add_argument(
        "--before",
        type=options.job_id,
        metavar="ID",
        help="only jobs submitted before job ID (the next page of a cut list)",
    )
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("show", help="one job in detail: why it waits, its tasks, its events")
    add_server_option(p)
    p.add_argument("id", type=options.job_id, metavar="ID")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("logs", help="print a job's output")
    add_server_option(p)
    p.add_argument("id", type=options.job_id, metavar="ID")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming until it ends")
    p.add_argument("--task", help="only this task, e.g. worker-1")
    p.add_argument("--attempt", type=int, help="an earlier attempt (default: the latest)")
    p.add_argument(
        "--raw",
        action="store_true",
        help="on a terminal too, the output as the job wrote it (by default a terminal gets its "
        "colours, and every other control character as an escape such as \\x1b)",
    )
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("cancel", help="cancel jobs (running ones get SIGTERM, then SIGKILL)")
    add_server_option(p)
    p.add_argument("ids", nargs="*", metavar="ID", type=options.job_id)
    bulk = p.add_argument_group(
        "many at once",
        "cancel every live job these name, in one request (an admin's take "
        "every user's jobs unless --all-mine; a user's are always their own)",
    )
    bulk.add_argument("--all-mine", action="store_true", help="your own jobs")
    bulk.add_argument("--queue", metavar="Q", help="jobs in queue Q")
    bulk.add_argument("--state", choices=("pending", "running"), help="only jobs in this state")
    p.set_defaults(func=cmd_cancel)


# --- run / submit ---------------------------------------------------------------------------


def shell_string_or_words(command: list[str], workdir: str) -> str | list[str]:
    """The job's `command` for the words after `run`. One word that a shell would read as
    more than itself (`aisched run 'A=1 python t.py | tee log'`: spaces, quotes, operators,
    `$`, `~`...) is a command line meant for a shell: it is sent as a string, which a job
    runs with /bin/sh -c, as a job file's string `command`. Exec'd as one program's name it
    could only fail (command not found). A word that names a file in `workdir` (a path
    with a space) stays a program; several words are run as they are, with no shell."""
    if len(command) != 1 or shlex.quote(command[0]) == command[0]:
        return command
    if os.path.exists(os.path.join(workdir, command[0])):
        return command
    return command[0]


def run_document(args: argparse.Namespace) -> dict[str, Any]:
    """The native job document `run` submits (checked here only as far as flags go; the
    service validates the whole)."""
    from aisched.spec.errors import SpecError
    from aisched.spec.units import parse_cpus_milli, parse_duration_s, parse_gpus, parse_mem_mib

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CLIError(
            "aisched run: give the command after --, e.g. aisched run -- python train.py"
        )
    try:
        cpus = parse_cpus_milli(args.cpus, "--cpus")
        gpu, gpu_milli = parse_gpus(args.gpus, "--gpus")
        parse_mem_mib(args.mem, "--mem")
        if args.gpu_mem:
            parse_mem_mib(args.gpu_mem, "--gpu-mem")
        for flag, value in (
            ("--time-limit", args.time_limit),
            ("--grace-period", args.grace_period),
            ("--estimate", args.estimate),
        ):
            if value is not None:
                parse_duration_s(value, flag)
    except (SpecError, ValueError) as e:
        raise CLIError(str(e)) from None
    resources: dict[str, Any] = {"cpus": cpus / 1000 if cpus % 1000 else cpus // 1000}
    resources["mem"] = args.mem
    if gpu or gpu_milli:
        resources["gpus"] = gpu if gpu else gpu_milli / 1000
    if args.gpu_mem:
        resources["gpu_mem"] = args.gpu_mem
    env: dict[str, str] = {}
    if args.env_all:
        env = {
            k: v
            for k, v in os.environ.items()
            if _ENV_NAME.match(k) and not _owned(k) and k not in _NOISE
        }
        if args.image:
            # A container's variable cannot hold a line break (the service refuses one): a
            # shell's multi-line variable left out should not refuse the whole job.
            broken = sorted(k for k, v in env.items() if "\n" in v or "\r" in v)
            for k in broken:
                del env[k]
            if broken:
                print(
                    f"aisched: --env-all: left out {', '.join(broken)}: a container's "
                    "variable cannot hold a line break",
                    file=sys.stderr,
                )
    for item in args.env:
        key, sep, value = item.partition("=")
        if not _ENV_NAME.match(key):
            raise CLIError(f"--env {item!r}: expected NAME=VALUE or NAME")
        if not sep:
            if key not in os.environ:
                raise CLIError(f"--env {key}: {key} is not set here; give --env {key}=VALUE")
            value = os.environ[key]
        env[key] = value
    workdir = os.path.abspath(args.workdir or os.getcwd())
    doc: dict[str, Any] = {
        "command": shell_string_or_words(command, workdir),
        "replicas": args.replicas,
        "resources": resources,
        "workdir": workdir,
    }
    if env:
        doc["env"] = env
    for key, value in (
        ("name", args.name),
        ("queue", args.queue),
        ("kind", args.kind),
        ("min_available", args.min_available),
        ("time_limit", args.time_limit),
        ("grace_period", args.grace_period),
        ("image", args.image),
        ("network", args.network),
        ("bandwidth", args.bandwidth),
        ("shm_size", args.shm_size),
        ("estimate", args.estimate),
    ):
        if value is not None:
            doc[key] = value
    if args.priority is not None:
        try:
            doc["priority"] = int(args.priority)
        except ValueError:
            doc["priority_class"] = args.priority
    if args.not_preemptible:
        doc["preemptible"] = False
    if args.restart is not None or args.max_retries is not None:
        restart: dict[str, Any] = {}
        if args.restart is not None:
            restart["policy"] = args.restart
        if args.max_retries is not None:
            restart["max_retries"] = args.max_retries
        doc["restart"] = restart
    return doc


# `run` and `submit` retry a submission that timed out or found the store failing, with one
# Idempotency-Key per job sent, so the service makes the job once however often it is sent.
SUBMIT_TRIES = 4
SUBMIT_TIMEOUT_S = float(os.environ.get("AISCHED_SUBMIT_TIMEOUT", "30"))


def _add_idempotency_key(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--idempotency-key",
        metavar="KEY",
        type=options.idempotency_key,
        help="send the submission with this key (default: a new one): the same key again gets "
        "the job it made rather than a second one; a failed submission's error names its key",
    )


def _owned(name: str) -> bool:
    """A variable the scheduler sets itself: a job may not (the service refuses it)."""
    return name in SCHEDULER_ENV or name.startswith(SCHEDULER_ENV_PREFIX)


# The job field each flag of `run` fills (run_document), for the service's errors to name
# the flag that was given, not a field of a document the user never saw.
_FLAG_OF_FIELD = {
    "resources.gpus": "--gpus",
    "resources.gpu_milli": "--gpus",
    "resources.cpus": "--cpus",
    "resources.mem": "--mem",
    "resources.gpu_mem": "--gpu-mem",
    "replicas": "--replicas",
    "min_available": "--min-available",
    "name": "--name",
    "queue": "--queue",
    "kind": "--kind",
    "priority": "--priority",
    "priority_class": "--priority",
    "preemptible": "--not-preemptible",
    "restart.policy": "--restart",
    "restart.max_retries": "--max-retries",
    "time_limit": "--time-limit",
    "estimate": "--estimate",
    "grace_period": "--grace-period",
    "image": "--image",
    "network": "--network",
    "bandwidth": "--bandwidth",
    "shm_size": "--shm-size",
    "workdir": "--workdir",
}
_RUN_SOURCE = "aisched run"
_RUN_PROBLEM = re.compile(rf"^{_RUN_SOURCE}: (?:tasks\.0\.)?([A-Za-z_][\w.]*): ")


def _flag_named(line: str) -> str:
    """A problem line of the service about `run`'s document, with the field it names put as
    the flag (or the command) it came from: `--gpus: ...` for `resources.gpus: ...`."""
    m = _RUN_PROBLEM.match(line)
    if m is None:
        return line
    field = m.group(1)
    if field in _FLAG_OF_FIELD:
        flag = _FLAG_OF_FIELD[field]
    elif field.startswith("env."):
        flag = f"--env {field.removeprefix('env.')}"
    elif field == "command" or field.startswith("command."):
        flag = "the command (after --)"
    else:
        return line
    return f"{_RUN_SOURCE}: {flag}: {line[m.end() :]}"


def cmd_run(args: argparse.Namespace) -> int:
    doc = run_document(args)
    client = Client.from_args(args)
    try:
        out = _send_submission(
            client, args.idempotency_key, json=doc, params={"source": _RUN_SOURCE}
        )
    except CLIError as e:
        text = "\n".join(_flag_named(line) for line in str(e).split("\n"))
        raise CLIError(text, e.status, e.kept_nothing) from None
    return _submitted(client, args, out)


def _send_submission(
    client: Client, key: str | None, headers: dict[str, str] | None = None, **kwargs: Any
) -> Any:
    """POST /v1/jobs with Idempotency-Key `key` (None: a new one), retried as `send_retrying`
    does. When it fails for the service's sake (a time-out, the store failing), the service
    may keep it and store it later: the error names the key, which sends it again as the same
    submission."""
    key = key or uuid.uuid4().hex
    try:
        return client.send_retrying(
            "POST",
            "/v1/jobs",
            tries=SUBMIT_TRIES,
            timeout_s=SUBMIT_TIMEOUT_S,
            headers={**(headers or {}), "Idempotency-Key": key},
            **kwargs,
        )
    except CLIError as e:
        if e.status != EXIT_FAILURE or isinstance(e, NotSent) or e.kept_nothing:
            raise  # refused for what it is (the same key would be), never sent, or not kept
        raise CLIError(
            f"{e}\nits Idempotency-Key is {key}: send it again with --idempotency-key {key} "
            "to get the job it made, if the service kept it, rather than a second one",
            e.status,
        ) from None


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit each file in order. All are read first, so an unreadable one submits none; the
    service refuses a bad file with its name in the error, and the ones before it stay
    submitted. With --json and several files, one JSON list of the answers."""
    files: list[str] = args.files
    if args.follow and len(files) > 1:
        raise CLIError("--follow: follows one job; give one file")
    if files.count("-") > 1:
        raise CLIError("-: standard input can be read once")
    if args.idempotency_key and len(files) > 1:
        raise CLIError("--idempotency-key: a key is one submission's; give one file")
    texts = [_read_job_file(f) for f in files]
    client = Client.from_args(args)
    status = 0
    answers: list[dict[str, Any]] = []
    for text, source in texts:
        out = _send_submission(
            client,
            args.idempotency_key,
            {"Content-Type": "application/yaml"},
            content=text.encode("utf-8"),
            params={"source": source, "workdir": os.getcwd()},
        )
        if args.json and len(files) > 1:
            answers.append(out)  # one JSON document for all: a list, in file order
            continue
        status = max(status, _submitted(client, args, out))
    if answers:
        print(json.dumps(answers, indent=2))
    return status


def _read_job_file(name: str) -> tuple[str, str]:
    """(text, source name) of a job file, or of standard input for -."""
    if name == "-":
        text = sys.stdin.read(MAX_JOB_FILE + 1)
        if len(text.encode()) > MAX_JOB_FILE:
            raise CLIError("<stdin>: larger than 1 MiB; no job file is that large")
        return text, "<stdin>"
    try:
        return read_text_file(name, "job file", MAX_JOB_FILE), Path(name).name
    except SpecError as e:
        raise CLIError(str(e)) from None


def _submitted(client: Client, args: argparse.Namespace, out: dict[str, Any]) -> int:
    if args.json and not args.follow:
        print(json.dumps(out, indent=2))
        return 0
    err = console(stderr=True)
    for w in out.get("warnings") or []:
        err.print(Text.assemble(("warning:", "yellow"), " ", plain(w)))
    job_id = out["id"]
    pipeline = out.get("jobs") or []
    if pipeline and not args.follow:
        for j in pipeline:  # one line per job, in file order: `ID NAME`
            print(
                f"{j['id']} {j['name']}"
                if not sys.stdout.isatty()
                else f"submitted job {j['id']} {j['name']}"
            )
        return 0
    if pipeline:  # follow the last step: it ends when the pipeline does
        for j in pipeline[:-1]:  # the others' ids, to read their logs with
            err.print(plain(f"submitted job {j['id']} {j['name']}"))
        job_id = pipeline[-1]["id"]
    if not args.follow:
        print(job_id if not sys.stdout.isatty() else f"submitted job {job_id}")
        return 0
    err.print(f"submitted job {job_id}; following its logs (Ctrl-C stops following)")
    return _follow(client, job_id)


def _follow(client: Client, job_id: str) -> int:
    for chunk in client.stream(f"/v1/jobs/{job_id}/logs", {"follow": "true"}):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    job = client.request("GET", f"/v1/jobs/{job_id}")
    while job["state"] in ("pending", "running"):  # the stream ended with the job; settle
        time.sleep(0.2)
        job = client.request("GET", f"/v1/jobs/{job_id}")
    console(stderr=True).print(
        plain(
            f"job {job_id} {job['state']}" + (f": {job['message']}" if job.get("message") else "")
        )
    )
    if job["state"] == "succeeded":
        return 0
    code = job.get("exit_code")
    if isinstance(code, int) and -128 < code < 0:  # killed by signal -code: 128+N, as a shell
        return 128 - code
    return code if isinstance(code, int) and 0 < code < 256 else 1


# --- jobs / show / logs / cancel ------------------------------------------------------------


def cmd_jobs(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    for key in ("state", "queue", "user", "before"):
        if getattr(args, key):
            params[key] = getattr(args, key)
    if args.all:
        params["all"] = "true"
    client = Client.from_args(args)
    if args.queue:
        _known_queue(client, args.queue)
    out = client.request("GET", "/v1/jobs", params=params)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    now = time.time()
    rows = [
        (
            j["id"],
            j["name"],
            j["user"],
            j["queue"],
            str(j["priority"]),
            Cell(
                j["state"] + (f" ({j['stopping']})" if j.get("stopping") else ""),
                _STATE_STYLE.get(j["state"], ""),
            ),
            f"{j['gpus']:g}",
            _age(now - j["submitted_at"]),
            _why(j, now),
        )
        for j in out["jobs"]
    ]
    render(_JOBS_HEADER, rows, right=frozenset({"ID", "PRI", "GPUS"}), cut={"NAME": _NAME_MOST})
    if out.get("more"):
        # On stderr: stdout stays the table alone, for a pipe to count or grep.
        more = (
            f"--limit {min(args.limit * 10, MAX_LIST_LIMIT)} or "
            if args.limit < MAX_LIST_LIMIT
            else ""
        )
        print(
            f"... more jobs: {more}--before {printable(str(out.get('next_before')))}",
            file=sys.stderr,
        )
    return 0


def _known_queue(client: Client, name: str) -> None:
    """Refuse a `--queue` the service does not have, naming those it has: a misspelt queue
    listed or cancelled nothing and said `0 job(s)`, as if it were empty."""
    queues = [q["name"] for q in client.request("GET", "/v1/queues")["queues"]]
    if name not in queues:
        raise CLIError(
            f"--queue: no queue {printable(name)!r} here; the queues: {', '.join(queues)}"
        )


def _why(j: dict[str, Any], now: float) -> str:
    if j["state"] == "pending":
        return waiting_words(j.get("reason") or "", j.get("eta"), now)
    if j["state"] == "running" and j["kind"] == "service":
        return "serving: its replicas are jobs of their own (aisched show)"
    if j["state"] == "running":
        return f"attempt {j['attempt']}"
    return j.get("message") or ""


def cmd_show(args: argparse.Namespace) -> int:
    j = Client.from_args(args).request("GET", f"/v1/jobs/{args.id}")
    if args.json:
        print(json.dumps(j, indent=2))
        return 0
    print_job(j, console(), time.time())
    return 0


def print_job(j: dict[str, Any], con: Console, now: float) -> None:
    """`aisched show` of the job `j` (as `GET /v1/jobs/ID` answers) on `con`."""
    con.print(Text.assemble(plain(f"job {j['id']}", "bold"), " ", plain(j["name"])))
    # Values are another user's text as often as not: printed as `Text`, never as markup.
    rows: list[tuple[str, str | Text]] = [
        ("state", Text.assemble(plain(j["state"], _STATE_STYLE.get(j["state"], "")),
                                f" (stopping: {j['stopping']})" if j.get("stopping") else "")),
        ("user / queue", f"{j['user']} / {j['queue']}"),
        ("priority", str(j["priority"])),
        ("kind", j["kind"]),
        ("submitted", _when(j["submitted_at"], now)),
    ]  # fmt: skip
    if j.get("replica_of"):
        rows.append(("replica of", f"service {j['replica_of']}"))
    if j.get("elastic"):
        now_running = j.get("running_tasks")
        rows.append(
            (
                "elastic",
                f"{j['min_tasks']}..{j['max_tasks']} tasks"
                + (f", running {now_running}" if now_running is not None else ""),
            )
        )
    sv = j.get("service")
    if sv:
        rows.append(
            (
                "replicas",
                f"{sv['replicas'] if sv['replicas'] is not None else len(sv['replica_ids'])} "
                f"({sv['ready'] or 0} ready; {sv['min_replicas']}..{sv['max_replicas']}): "
                + (", ".join(sv["replica_ids"]) or "none"),
            )
        )
        load = "no figure yet" if sv["load"] is None else f"{sv['load']:.3g}"
        rows.append(("load", f"{sv['metric']} {load} for a target of {sv['target']:g}"))
        if sv.get("reason"):
            rows.append(("autoscaler", f"wants {sv['desired']}: {sv['reason']}"))
        if sv["endpoints"]:
            rows.append(("endpoints", " ".join(sv["endpoints"])))
    if j.get("depends_on"):
        rows.append(
            (
                "depends on",
                ", ".join(
                    f"{d['job']} ({'to succeed' if d['condition'] == 'success' else 'to end'})"
                    for d in j["depends_on"]
                ),
            )
        )
    if j["state"] == "pending":
        rows.append(("waiting because", j.get("reason") or "not yet considered"))
        if j.get("eta"):
            rows.append(("estimated start", eta_words(j["eta"], now)))
    if j.get("predicted_s") and j["state"] in ("pending", "running"):
        rows.append(
            (
                "predicted runtime",
                f"{_age(j['predicted_s'])} (90% within {_age(j['predicted_upper_s'])})",
            )
        )
    if j.get("started_at"):
        rows.append(("first started", _when(j["started_at"], now)))
    if j.get("finished_at"):
        rows.append(("finished", _when(j["finished_at"], now)))
    if not sv:  # a service runs no attempts of its own: its replicas do (each shown alone)
        rows.append(
            (
                "attempts",
                f"{j['attempt']} (preempted {j['preemptions']}x, failed {j['failures']}x; "
                f"restart {j['restart_policy']}, max retries {j['max_retries']})",
            )
        )
    if j.get("message"):
        rows.append(("result", j["message"]))
    if j.get("exit_code") is not None:
        rows.append(("exit code", str(j["exit_code"])))
    if not sv and j["checkpoint_dir"]:  # empty: another user's job, its directory not shown
        rows.append(("checkpoint dir", j["checkpoint_dir"]))
    for g in j["groups"]:
        req = [f"{g['milli_cpu'] / 1000:g} CPU", describe_mib(g["mem_mib"])]
        if g["gpu"] or g["gpu_milli"]:
            req.insert(0, f"{g['gpu'] + g['gpu_milli'] / 1000:g} GPU")
        rows.append(
            (
                f"tasks {g['name']}",
                # Quoted as a shell would need it: `sh -c python x.py` read as `sh -c python`.
                # Another user's job comes without its command.
                f"{g['replicas']} x ({', '.join(req)})"
                + (f": {shlex.join(g['command'])}" if g["command"] else ""),
            )
        )
    for w in j.get("warnings") or []:
        rows.append(("warning", w))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        con.print(Text.assemble(f"  {k:<{width}}  ", v if isinstance(v, Text) else plain(v)))
    if j["tasks"]:
        title = f"attempt {j['attempt']}"
        declared = sum(g["replicas"] for g in j["groups"])
        if len(j["tasks"]) < declared:  # started short of its tasks (min_available)
            title += f": {len(j['tasks'])} of its {declared} tasks started"
        con.print(plain(title))
        rows_of_tasks = []
        for task in j["tasks"]:
            exit_text = ""
            if task["state"] == "exited":
                exit_text = task["exit_kind"] or ""
                if task["exit_code"] is not None:
                    exit_text += f" {task['exit_code']}"
            rows_of_tasks.append(
                (
                    task["name"],
                    task["node"],
                    ",".join(map(str, task["gpus"])) or "-",
                    task["state"],
                    exit_text,
                    task["log_path"],
                )
            )
        # Plain columns, as `jobs`: a pipe gets whole lines, the LOG path never cut.
        render(("TASK", "NODE", "GPUS", "STATE", "EXIT", "LOG"), rows_of_tasks, out=con.file)
    if j["events"]:
        con.print("[bold]events[/]")
        # Said first, wherever it falls among the events: the last 20 may not show it.
        forgot = [e for e in j["events"] if e["kind"] == "attempts-forgotten"]
        if forgot:
            con.print(plain(f"  ({forgot[-1]['message']})"))
        for e in j["events"][-20:]:
            con.print(plain(f"  {clock(e['time'], now)}  {e['kind']:<12} {e['message']}"))


def cmd_logs(args: argparse.Namespace) -> int:
    client = Client.from_args(args)
    params: dict[str, Any] = {}
    if args.task:
        params["task"] = args.task
    if args.attempt is not None:
        if args.attempt < 1:  # 0 used to read as "the latest"
            raise CLIError("--attempt: attempts count from 1")
        params["attempt"] = args.attempt
    # Another user's output, an admin's above all, must not drive the reader's terminal.
    shown = None if args.raw or not sys.stdout.isatty() else TerminalOutput()
    if args.follow:
        params["follow"] = "true"
    # Streamed either way: a gang's log can be gigabytes, which one string held several times.
    tail = ""  # the end of what came, for the service's last word on a followed log
    wrote = False
    for chunk in client.stream(f"/v1/jobs/{args.id}/logs", params):
        sys.stdout.write(chunk if shown is None else shown.feed(chunk))
        sys.stdout.flush()
        tail = (tail + chunk)[-len(FOLLOW_STOPPED) :]
        wrote = wrote or bool(chunk)
    if shown is not None:
        sys.stdout.write(shown.close())
    if not wrote and not args.follow and args.attempt is None:
        # Nothing, and no word why: say so when it is that the job has not started.
        job = client.request("GET", f"/v1/jobs/{args.id}")
        if job["state"] == "pending":
            console(stderr=True).print(
                plain(
                    f"job {args.id} has not started yet: `aisched show {args.id}` says why, "
                    f"`aisched logs -f {args.id}` waits for its output"
                )
            )
    if args.follow and tail == FOLLOW_STOPPED:
        # The service stopped following: the token went. Its refusal of this says so and
        # fails; a job that merely printed that line last is shown as ended.
        client.request("GET", f"/v1/jobs/{args.id}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    many = args.all_mine or args.queue is not None or args.state is not None
    if many and args.ids:
        raise CLIError("cancel: give job IDs or --all-mine/--queue/--state, not both")
    if not many and not args.ids:
        raise CLIError("cancel: give job IDs, or --all-mine, --queue Q or --state S")
    client = Client.from_args(args)
    if many:
        if args.queue is not None:
            _known_queue(client, args.queue)
        body = {"mine": args.all_mine, "queue": args.queue, "state": args.state}
        out = client.request("POST", "/v1/jobs/cancel", json=body)
        if args.json:
            print(json.dumps(out, indent=2))
        else:
            print(
                f"{out['count']} job(s): {out['cancelled']} cancelled, "
                f"{out['stopping']} cancelling (tasks stopping)"
            )
        return 0
    results = []
    failed = None
    for job_id in args.ids:
        try:
            results.append(client.request("POST", f"/v1/jobs/{job_id}/cancel"))
        except CLIError as e:
            failed = e
            # Not wrapped at 80 columns: one error is one line, whatever reads it.
            Console(stderr=True, highlight=False, soft_wrap=True).print(
                Text(printable(f"error: {e}", lines=True))
            )
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            what = "cancelled" if r["state"] == "cancelled" else "cancelling (tasks stopping)"
            print(f"job {r['id']}: {what}")
    return 0 if failed is None else failed.status


# --- formatting -----------------------------------------------------------------------------


def _age(seconds: float) -> str:
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def _when(t: float, now: float) -> str:
    delta = now - t
    rel = f"{_age(delta)} ago" if delta >= 0 else f"in {_age(-delta)}"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))} ({rel})"
