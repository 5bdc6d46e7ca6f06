"""`aisched simulate` in process (through `main`) and for real, as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aisched import __version__
from aisched.cli.main import main
from aisched.sim.traces import synthetic_trace

SMALL = ["simulate", "--trace", "synthetic", "--jobs", "40", "--seed", "2", "--no-progress"]


def test_table_names_both_policies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--policy", "fifo,las", "--validate"]) == 0
    out = capsys.readouterr().out
    assert "fifo" in out and "las" in out
    assert "avg JCT (h)" in out and "GPU utilisation" in out
    assert "synthetic-2: 40 jobs" in out


def test_a_policy_named_like_markup_is_printed_as_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A policy file's `name` is the user's text: `[/x]` was read by rich as a closing tag, and
    the run ended in a MarkupError traceback after every replay; `[bold]` vanished."""
    for name in ("[/x]", "[bold]"):
        path = tmp_path / "p.yaml"
        path.write_text(f'name: "{name}"\nactions: [enqueue, allocate]\n')
        assert main([*SMALL, "--policy", f"fifo,{path}"]) == 0
        out = capsys.readouterr().out
        assert out.count(name) >= 2, out  # a column of the figures, rows of the queues


def test_control_characters_in_names_are_shown_as_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Philly VC and a policy file's `name` are the user's text: an ESC in either reached
    the terminal as it was (the tables wrapped names in Text, not in the escaping of
    cli.printable), where it could recolour, clear or retitle the reader's terminal."""
    trace = tmp_path / "philly.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:00:00,20.0,1,20.0,b\x1b]0;owned\x07b\n"
    )
    policy = tmp_path / "p.yaml"
    policy.write_text('name: "p\\e[2Jq"\nactions: [enqueue, allocate]\n')
    argv = ["simulate", "--trace", str(trace), "--cluster", "small", "--no-progress"]
    assert main([*argv, "--policy", f"fifo,{policy}"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "vc-b\\x1b]0;owned\\x07b" in out
    assert out.count("p\\x1b[2Jq") >= 2  # a column of the figures, a row of the queues


def test_a_skipped_row_is_quoted_as_the_trace_wrote_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first row --skip-invalid left out is quoted from the user's file: `[/x]` in it was
    read by rich as a closing tag (a MarkupError traceback before any replay)."""
    trace = tmp_path / "philly.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:00:00,20.0,1,20.0,bb\n"
        "2017-10-09 07:00:10,[/x],2,60.0,cc\n"
    )
    argv = ["simulate", "--trace", str(trace), "--skip-invalid", "--no-progress"]
    assert main([*argv, "--policy", "fifo"]) == 0
    err = capsys.readouterr().err
    assert "skipped 1 row that cannot be used (--skip-invalid); the first: " in err
    assert "'[/x]'" in err


def test_json_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "out.json"
    args = [*SMALL, "--policy", "fifo", "--checkpoint-interval", "inf", "--json", str(path)]
    assert main(args) == 0
    data = json.loads(path.read_text())
    assert data["trace"] == "synthetic-2" and data["jobs"] == 40
    assert data["config"]["checkpoint_interval_s"] == "inf"
    assert [r["policy"] for r in data["results"]] == ["fifo"]
    assert data["results"][0]["jobs_submitted"] == 40


def test_a_policy_whose_run_aborts_loses_not_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One policy's run ending in a SimulationError took every other policy's figures with
    it: the run stopped there, with no table and no JSON. The others are shown and written,
    and the error says which policy failed, why, and which figures are there."""
    import aisched.sim.engine as engine_mod

    # las preempts: a cycle that evicts is followed by another at the same instant, which
    # this guard, lowered to one, reads as a policy undoing its own decisions.
    monkeypatch.setattr(engine_mod, "_MAX_CYCLES_AT_ONE_INSTANT", 1)
    path = tmp_path / "run.json"
    assert main([*SMALL, "--policy", "fifo,las,sjf", "--json", str(path)]) == 1
    out = capsys.readouterr()
    assert out.err.startswith("error: policy las: t=")
    assert out.err.endswith("; the figures above are of fifo, sjf\n")
    header = next(line for line in out.out.splitlines() if "metric" in line)
    assert "fifo" in header and "sjf" in header and "las" not in header
    data = json.loads(path.read_text())
    assert [r["policy"] for r in data["results"]] == ["fifo", "sjf"]
    assert [f["policy"] for f in data["failed"]] == ["las"]


def test_bad_policy_exits_2_with_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--policy", "fifo,nonsense"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nonsense" in err
    assert "Traceback" not in err


def test_bad_cluster_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("pools: [{name: x}]\n")
    assert main([*SMALL, "--cluster", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err


def test_unknown_trace_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--trace", "no-such-trace.csv", "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_missing_traces_dir_exits_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AISCHED_TRACES", str(tmp_path / "nowhere"))
    assert main(["simulate", "--trace", "philly", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "AISCHED_TRACES" in err


def test_bad_config_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--checkpoint-interval", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"aisched {__version__}"


def test_subprocess_writes_json(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aisched.cli.main",
            *SMALL,
            "--policy",
            "fifo,sjf",
            "--json",
            str(path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "fifo" in proc.stdout and "sjf" in proc.stdout
    data = json.loads(path.read_text())
    assert [r["policy"] for r in data["results"]] == ["fifo", "sjf"]
    assert all(r["jobs_finished"] == 40 for r in data["results"])


def test_subprocess_bad_policy(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "aisched", *SMALL, "--policy", "bogus"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_learned_and_oracle_policies_with_etas(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*SMALL, "--policy", "qssf,sjf-oracle,srtf-oracle", "--eta", "--one-queue"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "qssf" in out and "srtf-oracle" in out
    assert "runtime estimate: true <= upper" in out and "ETA: median abs. error (h)" in out


def test_bad_estimator_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([*SMALL, "--estimator", "magic"])
    assert e.value.code == 2
    assert "--estimator" in capsys.readouterr().err


def _tiny_openb(tmp_path: Path) -> tuple[Path, Path]:
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        "p0,1000,1024,1,500\np1,1000,1024,1,300\np2,1000,1024,1,500\np3,1000,1024,1,700\n"
    )
    nodes = tmp_path / "cluster.yaml"
    nodes.write_text(
        "nodes:\n"
        "  - {name: a, cpus: 8, mem_gib: 64, gpus: 1, gpu_model: A100}\n"
        "  - {name: b, cpus: 8, mem_gib: 64, gpus: 1, gpu_model: A100}\n"
    )
    return pods, nodes


def test_saturate_compares_placements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods, nodes = _tiny_openb(tmp_path)
    out_json = tmp_path / "sat.json"
    args = ["simulate", "--trace", str(pods), "--cluster", str(nodes), "--saturate"]
    args += ["--placement", "fgd,bestfit", "--targets", "1.0", "--json", str(out_json)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "GPU unallocated" in out
    rows = [line for line in out.splitlines() if "100.00 %" in line]  # the demand arrived
    assert "fgd" in rows[0] and "0.00 %" in rows[0] and "-100 %" in rows[0]
    assert "bestfit" in rows[1] and "35.00 %" in rows[1]
    data = json.loads(out_json.read_text())
    assert [r["policy_name"] for r in data["results"]] == ["fgd", "bestfit"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--saturate", "--targets", "x"], "--targets: expected shares"),
        (["--saturate", "--targets", "90"], "above 0 and at most 10 (0.9 is 90 %), got '90'"),
        (["--placement", "fgd"], "--placement goes with --saturate"),
        (["--saturate", "--placement", "nope"], "unknown policy 'nope'"),
        (["--gpu-speeds", "T4"], "--gpu-speeds: 'T4' is not MODEL=SPEED"),
        # An empty table; a run that stopped before time began; the fields' own names.
        (["--max-time", "-1"], "--max-time: -1 is not a virtual time (seconds, at least 0)"),
        (["--checkpoint-interval", "0"], "--checkpoint-interval must be positive, got 0.0"),
        (["--interval", "-1"], "--interval must be finite and >= 0, got -1.0"),
    ],
)
def test_bad_saturation_flags_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    pods, nodes = _tiny_openb(tmp_path)
    args = ["simulate", "--trace", str(pods), "--cluster", str(nodes), "--no-progress", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


AUTOSCALED = """\
autoscaling_pools:
  - name: gpu
    min: 0
    max: 8
    provisioning_delay_s: 120
    scale_down_idle_s: 600
    cost_per_node_hour: 10
    template: {cpus: 96, mem_gib: 1024, gpus: 8, gpu_model: A100, gpu_mem_gib: 80}
"""


def test_autoscaled_cluster_reports_node_hours_and_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = tmp_path / "auto.yaml"
    c.write_text(AUTOSCALED)
    figures = {}
    for extra in ([], ["--pools-at-max"]):
        path = tmp_path / f"out{len(extra)}.json"
        args = [*SMALL, "--cluster", str(c), "--json", str(path), *extra]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert "node-hours" in out and "cost" in out
        figures[len(extra)] = json.loads(path.read_text())["results"][0]
    assert "autoscaling pool gpu: fixed at 8 nodes of 8 GPUs (up in 120 s" in out
    auto, fixed = figures[0], figures[1]
    assert auto["jobs_finished"] == fixed["jobs_finished"] == 40
    assert auto["nodes_added"] > 0 and fixed["nodes_added"] == 0
    assert auto["node_hours"] < fixed["node_hours"]
    assert auto["cost"] == pytest.approx(10 * auto["node_hours"])


def test_pools_at_max_needs_pools(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--pools-at-max"]) == 2
    assert "no autoscaling pools" in capsys.readouterr().err


def test_saturate_wants_a_fixed_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = tmp_path / "auto.yaml"
    c.write_text(AUTOSCALED)
    assert main([*SMALL, "--cluster", str(c), "--saturate"]) == 2
    assert "--pools-at-max" in capsys.readouterr().err


def test_queues_file_replays_under_the_services_queues(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The synthetic trace's users submit to q0 and q1; q0 capped at one GPU rejects every job
    # of q0 that asks for more, as the service refuses it at submission.
    queues = tmp_path / "aisched.yaml"
    queues.write_text("queues:\n  - {name: q0, limit: {gpus: 1}}\n  - {name: q1}\n")
    out = tmp_path / "out.json"
    assert main([*SMALL, "--queues", str(queues), "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    trace = synthetic_trace(40, seed=2)
    too_big = [tj for tj in trace.jobs if tj.job.queue == "q0" and tj.job.total_request.gpu > 1]
    assert too_big and result["jobs_rejected"] == len(too_big)
    assert main([*SMALL, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["results"][0]["jobs_rejected"] == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # The service's own parser: the file and the field are named.
        ("queues:\n  - {name: q0, user_limit: {gpus: -1}}\n", "{file}: queues.0.user_limit.gpus"),
        ("queues:\n  - {name: q0, user_limit: {gpu: 2}}\n", "queues.0.user_limit.gpu: unknown"),
        ("queues:\n  - {name: q0, parent: nowhere}\n", "{file}: queues: queue q0: parent"),
        ("node: {gpus: 2}\n", "--queues {file}: no queues: list in it"),
        (
            "queues:\n  - {name: q0}\n",
            "--queues {file}: the trace's jobs use queues it does not name: q1",
        ),
    ],
)
def test_a_bad_queues_file_exits_2_naming_the_file_and_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(text)
    assert main([*SMALL, "--queues", str(queues)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert message.format(file=queues) in err


def test_json_makes_its_folder_and_refuses_a_folder_for_its_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--json out/run.json`, as the docs write it, failed in a checkout without out/.
    argv = ["simulate", "--jobs", "20", "--no-progress", "--json"]
    assert main([*argv, str(tmp_path / "out" / "run.json")]) == 0
    assert json.loads((tmp_path / "out" / "run.json").read_text())
    capsys.readouterr()
    assert main([*argv, str(tmp_path / "out")]) == 2  # refused before the run, not after
    err = capsys.readouterr().err
    assert err == f"error: --json: {tmp_path / 'out'} is a folder; give a file name, e.g. " \
        f"{tmp_path / 'out' / 'run.json'}\n"  # fmt: skip


@pytest.mark.parametrize(
    "flag",
    [
        ["--report", "r"],
        ["--eta"],
        ["--one-queue"],
        ["--max-time", "5"],
        ["--policy", "las"],
        # Ignored without a word too: fifo was taken for "not given".
        ["--policy", "fifo"],
        ["--estimator", "oracle"],
        ["--interval", "5"],
        ["--checkpoint-interval", "3600"],
        ["--restart-cost", "60"],
    ],
)
def test_saturate_refuses_the_flags_of_a_replay_in_time(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Each was ignored without a word.
    assert main(["simulate", "--jobs", "20", "--saturate", "--no-progress", *flag]) == 2
    assert capsys.readouterr().err.startswith(f"error: {flag[0]} goes with replaying time")


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        (["--jobs", "5"], "--jobs goes with --trace synthetic; to replay the first N jobs of"),
        (["--seed", "5"], "--seed goes with --trace synthetic; a trace is replayed as it is"),
    ],
)
def test_the_synthetic_traces_flags_are_refused_with_a_trace_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: list[str], said: str
) -> None:
    """--jobs and --seed were ignored without a word for any trace but the synthetic one."""
    trace = tmp_path / "philly.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:00:00,20.0,1,20.0,bb\n"
    )
    argv = ["simulate", "--trace", str(trace), "--cluster", "small", "--no-progress", *flag]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.err.startswith(f"error: {said}") and out.out == ""


@pytest.mark.parametrize(
    ("rows", "extra", "why"),
    [
        ("", [], "the trace holds none"),
        ("2017-10-09 07:00:00,20.0,0,0.0,bb\n", ["--skip-invalid"], "--skip-invalid left out"),
    ],
)
def test_a_trace_of_no_job_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str, extra: list[str], why: str
) -> None:
    """A header and no rows ran a replay of nothing and printed its empty tables."""
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + rows)
    argv = ["simulate", "--trace", str(trace), "--cluster", "small", "--no-progress", *extra]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert f"error: --trace {trace}: no job to replay ({why}" in out.err
    assert out.out == ""


def test_no_synthetic_job_is_refused_by_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--jobs", "0", "--no-progress"])
    assert done.value.code == 2
    assert "argument --jobs: 0: from 1 to 1,000,000,000" in capsys.readouterr().err


def test_gpu_speeds_of_a_model_given_twice_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """T4=0.5,T4=2 ran with 2 without a word."""
    assert main([*SMALL, "--gpu-speeds", "T4=0.5,T4=2"]) == 2
    assert capsys.readouterr().err == "error: --gpu-speeds: T4 is given twice (0.5 and 2)\n"


def test_gpu_speeds_of_a_model_the_cluster_lacks_are_warned_about(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Models match exactly: t4=0.5 (wrong case) changed nothing, without a word."""
    assert main([*SMALL, "--cluster", "small", "--gpu-speeds", "t4=0.5,A100=2"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(
        "warning: --gpu-speeds: no node of the cluster has a GPU of model 't4', so its speed "
        "is not used (the cluster's models: "
    )
    assert len(err.splitlines()) == 1  # A100 is the small cluster's model


def test_a_limit_of_no_job_is_refused_by_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    # It printed an empty table.
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--jobs", "10", "--no-progress", "--limit", "0"])
    assert done.value.code == 2
    assert "argument --limit: 0: from 1 to 1,000,000,000" in capsys.readouterr().err


def test_an_unknown_cluster_lists_every_built_in_and_a_queue_file_hint_fits_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # openb was left out of the list; --one-queue was suggested to a run that gave it.
    assert main(["simulate", "--jobs", "5", "--no-progress", "--cluster", "nosuch"]) == 2
    assert capsys.readouterr().err == (
        "error: unknown built-in cluster 'nosuch'; built-ins: openb, philly, small\n"
    )
    queues = tmp_path / "q.yaml"
    queues.write_text("queues:\n  - name: other\n")
    argv = ["simulate", "--jobs", "5", "--no-progress", "--one-queue", "--queues", str(queues)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: --queues {queues}: the trace's jobs use queues it does not name: default "
        "(add them)\n"
    )


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody may write in: mode 0555, and for root (whom modes do not stop) the
    immutable attribute, where the filesystem has it."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is refused here (a filesystem without it)")
        try:
            yield folder
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(0o755)


@pytest.mark.parametrize(
    ("flag", "target", "said"),
    [
        ("--json", "run.json", "--json: cannot write {ro}/run.json: "),
        ("--report", "", "--report: cannot write {ro}/index.html: "),
        ("--report", "rep", "--report: cannot make the folder {ro}/rep: "),
    ],
)
def test_an_unwritable_output_is_refused_before_the_run(
    read_only_dir: Path, capsys: pytest.CaptureFixture[str], flag: str, target: str, said: str
) -> None:
    """A read-only folder for --json or --report was found only after every simulation had
    run (18 s of them in the report), and their results were lost."""
    path = read_only_dir / target if target else read_only_dir
    assert main([*SMALL, "--policy", "fifo,las", flag, str(path)]) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: " + said.format(ro=read_only_dir))
    assert out.out == ""  # no table: nothing ran


def test_an_existing_json_file_is_checked_without_being_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check opens an existing file to append: a run refused after it (a bad policy)
    leaves the file as it was."""
    old = tmp_path / "run.json"
    old.write_text("kept\n")
    assert main([*SMALL, "--policy", "nonsense", "--json", str(old)]) == 2
    assert old.read_text() == "kept\n"
    assert list(tmp_path.iterdir()) == [old]  # nor a probe file left behind


@pytest.mark.parametrize("flag", ["--json", "--report"])
def test_an_empty_output_path_is_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flag: str,
) -> None:
    """`--report ''` wrote ./index.html without a word (an empty path is the current folder)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main([*SMALL, flag, ""])
    assert info.value.code == 2
    assert "expected a path, got an empty string" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_report_path_that_is_a_file_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tmp_path / "q.out"
    taken.write_text("mine\n")
    assert main(["simulate", "--jobs", "5", "--no-progress", "--report", str(taken)]) == 2
    out = capsys.readouterr()
    assert out.err == f"error: --report: {taken} is a file; give a folder for index.html\n"
    assert out.out == ""  # no table: nothing ran


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the file is empty; expected a CSV header row"),
        ("\n", "the first line is blank; expected a CSV header row"),
        ("a,b\n1,2\n", "header matches neither a Philly CSV (duration, num_gpus, timestamp)"),
    ],
)
def test_a_trace_without_a_usable_header_says_what_it_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(text)
    assert main(["simulate", "--trace", str(trace)]) == 2
    assert capsys.readouterr().err == f"error: --trace {trace}: {message}" + (
        " nor an openb pod list (cpu_milli, gpu_milli, num_gpu)\n" if "neither" in message else "\n"
    )


def test_a_trace_lacking_a_column_is_named_by_its_loader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,duration,cluster\n2017-10-09 07:01:55,66.0,11cb48\n")
    assert main(["simulate", "--trace", str(trace)]) == 2
    assert "column 'num_gpus': header lacks column(s) num_gpus" in capsys.readouterr().err


def test_a_trace_saved_with_a_byte_order_mark_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    row = "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + row, encoding="utf-8-sig")
    assert main(["simulate", "--trace", str(trace), "--policy", "fifo", "--no-progress"]) == 0
    assert "vc-11cb48" in capsys.readouterr().out
