"""Trace loaders against the real public traces in ../shared/traces, and the seeded generator.

Figures asserted here are the ones the traces' READMEs publish, so a loader that drops, merges
or misreads rows fails.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from aisched.model.job import JobKind
from aisched.sim.traces import (
    Trace,
    TraceError,
    find_traces_dir,
    load_openb_nodes,
    load_openb_pods,
    load_philly,
    split_gpus,
    synthetic_cluster,
    synthetic_trace,
)


def _traces_dir() -> Path:
    try:
        return find_traces_dir()
    except FileNotFoundError as e:
        pytest.skip(f"public traces not available (set AISCHED_TRACES): {e}")


@pytest.fixture(scope="module")
def philly() -> Trace:
    _traces_dir()
    return load_philly()


@pytest.fixture(scope="module")
def openb() -> Trace:
    _traces_dir()
    return load_openb_pods()


def _assert_well_ordered(trace: Trace) -> None:
    keys = [(tj.job.submit_time_s, tj.job.id) for tj in trace.jobs]
    assert keys == sorted(keys)
    assert trace.jobs[0].job.submit_time_s == 0.0
    assert len({tj.job.id for tj in trace.jobs}) == len(trace.jobs)


# --- Philly -------------------------------------------------------------------------------


def test_philly_loads_every_row_sorted(philly: Trace) -> None:
    assert len(philly.jobs) == 82_247
    _assert_well_ordered(philly)
    assert philly.jobs[0].job.id == "philly-00000"
    assert philly.jobs[-1].job.id == "philly-82246"
    # 2017-09-04 10:30:41 to 2017-12-22 08:02:11, wall clock.
    assert philly.jobs[-1].job.submit_time_s == 9_408_690.0
    assert philly.cluster is None


def test_philly_gpu_histogram_matches_readme(philly: Trace) -> None:
    hist = Counter(int(tj.job.num_gpus) for tj in philly.jobs)
    assert hist == {
        1: 76_627,
        2: 1_818,
        4: 1_870,
        8: 1_643,
        12: 7,
        16: 199,
        24: 7,
        32: 67,
        64: 6,
        128: 3,
    }


def test_philly_queues_are_virtual_clusters(philly: Trace) -> None:
    per_vc = Counter(tj.job.queue for tj in philly.jobs)
    assert len(per_vc) == 15
    assert per_vc["vc-6214e9"] == 41_226
    assert per_vc["vc-795a4c"] == 3
    assert all(tj.job.user == tj.job.queue for tj in philly.jobs)
    assert all(tj.job.kind is JobKind.TRAIN and tj.job.estimate_s is None for tj in philly.jobs)


def test_philly_durations(philly: Trace) -> None:
    durations = sorted(tj.duration_s for tj in philly.jobs)
    assert durations[0] == 1.0
    assert durations[-1] == 4_628_226.0
    assert durations[len(durations) // 2] == 1_144.0


def test_philly_big_jobs_are_gangs_of_servers(philly: Trace) -> None:
    shapes = {
        int(tj.job.num_gpus): (tj.job.groups[0].replicas, tj.job.groups[0].request.gpu)
        for tj in philly.jobs
    }
    assert shapes == {
        1: (1, 1),
        2: (1, 2),
        4: (1, 4),
        8: (1, 8),
        12: (3, 4),
        16: (2, 8),
        24: (3, 8),
        32: (4, 8),
        64: (8, 8),
        128: (16, 8),
    }
    big = next(tj.job for tj in philly.jobs if tj.job.num_gpus == 16)
    assert big.gang_min == 2
    assert big.groups[0].request.milli_cpu == 8 * 3000
    assert big.groups[0].request.mem_mib == 8 * 12288


def test_philly_limit_and_min_duration_keep_ids(philly: Trace) -> None:
    first = load_philly(limit=100)
    assert first.jobs == philly.jobs[:100]
    long = load_philly(min_duration_s=60.0, limit=50)
    want = [tj for tj in philly.jobs if tj.duration_s >= 60.0][:50]
    assert [tj.job.id for tj in long.jobs] == [tj.job.id for tj in want]
    assert long.jobs[0].job.submit_time_s == 0.0
    t0 = want[0].job.submit_time_s
    assert [tj.job.submit_time_s for tj in long.jobs] == [tj.job.submit_time_s - t0 for tj in want]


def test_split_gpus() -> None:
    assert [split_gpus(n) for n in (1, 3, 8, 9, 12, 20, 24, 36)] == [
        (1, 1),
        (1, 3),
        (1, 8),
        (3, 3),
        (3, 4),
        (5, 4),
        (3, 8),
        (9, 4),
    ]
    with pytest.raises(ValueError):
        split_gpus(0)


_PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


@pytest.mark.parametrize(
    ("row", "column", "problem"),
    [
        ("2017-10-09 07:01:55,abc,1,66.0,11cb48", "duration", "positive number"),
        ("2017-10-09 07:01:55,-5,1,66.0,11cb48", "duration", "positive number"),
        ("2017-10-09 07:01:55,66.0,0,66.0,11cb48", "num_gpus", "integer from 1 to 1,000,000"),
        # A traceback (an overflow in the placement), and every figure garbage (1e308 s).
        ("2017-10-09 07:01:55,66.0,100000000000000000000,66.0,11cb48", "num_gpus", "1,000,000"),
        ("2017-10-09 07:01:55,1e308,1,66.0,11cb48", "duration", "seconds up to 1e+09"),
        ("yesterday,66.0,1,66.0,11cb48", "timestamp", "YYYY-MM-DD"),
        ("2017-10-09 07:01:55,66.0,1,66.0,", "cluster", "empty"),
        ("2017-10-09 07:01:55,66.0,1", "gpu_time", "expected 5 fields"),
    ],
)
def test_philly_bad_row_names_file_line_column(
    tmp_path: Path, row: str, column: str, problem: str
) -> None:
    f = tmp_path / "philly.csv"
    f.write_text(_PHILLY_HEADER + "2017-10-09 06:13:03,2951.0,1,2951.0,6214e9\n\n" + row + "\n")
    with pytest.raises(TraceError) as info:
        load_philly(f)
    assert str(info.value).startswith(f"{f}:4: column {column!r}: ")
    assert problem in str(info.value)
    assert (info.value.line, info.value.column) == (4, column)


def test_philly_small_file_and_folder(tmp_path: Path) -> None:
    (tmp_path / "philly.csv").write_text(
        _PHILLY_HEADER
        + "2017-10-09 07:00:10,10.0,16,160.0,aa\n"
        + "2017-10-09 07:00:00,20.0,1,20.0,bb\n"
        + "2017-10-09 07:00:10,30.0,2,60.0,cc\n\n"
    )
    trace = load_philly(tmp_path)  # a folder works too
    got = [(tj.job.id, tj.job.submit_time_s, tj.duration_s, tj.job.queue) for tj in trace.jobs]
    # Ties on the timestamp keep file order.
    assert got == [
        ("philly-00000", 0.0, 20.0, "vc-bb"),
        ("philly-00001", 10.0, 10.0, "vc-aa"),
        ("philly-00002", 10.0, 30.0, "vc-cc"),
    ]


def test_philly_stamps_with_an_offset_are_converted_to_utc(tmp_path: Path) -> None:
    """A stamp with an offset or a trailing Z was a TypeError (aware minus naive), a traceback
    even with --skip-invalid. It is converted to UTC; a naive stamp is read as it is."""
    f = tmp_path / "philly.csv"
    f.write_text(
        _PHILLY_HEADER
        + "2020-01-01 00:00:00Z,10.0,1,10.0,aa\n"
        + "2020-01-01 01:00:00+02:00,20.0,1,20.0,bb\n"  # 2019-12-31 23:00 UTC: the first
        + "2020-01-01 00:00:30,30.0,1,30.0,cc\n"
        + "2020-01-01T00:01:00-00:30,40.0,1,40.0,dd\n"
    )
    got = [(tj.job.id, tj.job.submit_time_s, tj.job.queue) for tj in load_philly(f).jobs]
    assert got == [
        ("philly-00000", 0.0, "vc-bb"),
        ("philly-00001", 3600.0, "vc-aa"),
        ("philly-00002", 3630.0, "vc-cc"),
        ("philly-00003", 3600.0 + 31 * 60, "vc-dd"),
    ]


def test_philly_skip_invalid_leaves_out_unusable_rows_and_counts_them(tmp_path: Path) -> None:
    f = tmp_path / "philly.csv"
    f.write_text(
        _PHILLY_HEADER
        + "2017-10-09 07:00:00,20.0,1,20.0,bb\n"
        + "2017-10-09 07:00:05,20.0,0,0.0,bb\n"  # 0 GPUs in a GPU trace
        + "2017-10-09 07:00:10,abc,2,60.0,cc\n"
        + "2017-10-09 07:00:20,30.0,2,60.0,cc\n"
    )
    with pytest.raises(TraceError):
        load_philly(f)
    trace = load_philly(f, skip_invalid=True)
    got = [(tj.job.id, tj.job.submit_time_s, tj.duration_s) for tj in trace.jobs]
    assert got == [("philly-00000", 0.0, 20.0), ("philly-00001", 20.0, 30.0)]
    assert (trace.skipped, trace.first_skipped) == (
        2,
        f"{f}:3: column 'num_gpus': expected an integer from 1 to 1,000,000, got '0'",
    )


# --- openb --------------------------------------------------------------------------------


def test_openb_nodes_match_readme() -> None:
    _traces_dir()
    cluster = load_openb_nodes()
    assert len(cluster.nodes) == 1_523
    assert cluster.total_gpus == 6_212
    models = Counter(n.gpu_model for n in cluster.nodes)
    assert models == {
        "G2": 549,
        "T4": 404,
        "P100": 134,
        "V100M16": 55,
        "G3": 39,
        "V100M32": 30,
        "A10": 2,
        None: 310,
    }
    assert Counter(len(n.gpus) for n in cluster.nodes) == {8: 617, 2: 518, 4: 54, 1: 24, 0: 310}
    # Racks of 16 in file order, one zone.
    assert len({n.rack for n in cluster.nodes}) == math.ceil(1_523 / 16)
    assert cluster.nodes[15].rack == "rack-000" and cluster.nodes[16].rack == "rack-001"
    assert {n.zone for n in cluster.nodes} == {"zone-00"}
    t4 = next(n for n in cluster.nodes if n.gpu_model == "T4")
    assert {g.mem_mib for g in t4.gpus} == {16_384}
    assert {g.nvlink_group for n in cluster.nodes for g in n.gpus} == {0}
    v32 = next(n for n in cluster.nodes if n.gpu_model == "V100M32")
    assert v32.gpus[0].mem_mib == 32_768

    gpu_only = load_openb_nodes(gpu_only=True, nodes_per_rack=8)
    assert len(gpu_only.nodes) == 1_213
    assert gpu_only.total_gpus == 6_212
    assert len({n.rack for n in gpu_only.nodes}) == math.ceil(1_213 / 8)


def test_openb_default_pods_match_readme(openb: Trace) -> None:
    assert openb.name == "openb-default"
    assert len(openb.jobs) == 8_152
    _assert_well_ordered(openb)
    assert openb.cluster is not None
    assert (len(openb.cluster.nodes), openb.cluster.total_gpus) == (1_523, 6_212)

    requests = [tj.job.groups[0].request for tj in openb.jobs]
    sharing = [r for r in requests if r.gpu_milli]
    assert len(sharing) == 3_078
    assert all(r.gpu == 0 and 0 < r.gpu_milli < 1000 for r in sharing)
    assert Counter(r.gpu_milli for r in sharing).most_common(4) == [
        (810, 1_078),
        (470, 750),
        (320, 328),
        (650, 253),
    ]
    whole = Counter(r.gpu for r in requests if not r.gpu_milli)
    assert whole == {1: 6_989 - 3_078, 0: 1_088, 8: 44, 2: 16, 4: 15}

    kinds = Counter(tj.job.kind for tj in openb.jobs)
    assert kinds == {JobKind.INFER: 4_647 + 7, JobKind.BATCH: 3_398 + 100}
    assert all(tj.job.num_tasks == 1 and tj.source == "openb" for tj in openb.jobs)
    assert openb.jobs[-1].job.submit_time_s == 12_901_761.0
    durations = sorted(tj.duration_s for tj in openb.jobs)
    assert durations[0] >= 1.0
    assert durations[len(durations) // 2] == 540.0
    assert durations[-1] == 12_537_496.0


def test_openb_first_pod(openb: Trace) -> None:
    tj = openb.jobs[0]
    assert tj.job.id == "openb-pod-0000"
    assert tj.job.kind is JobKind.INFER
    r = tj.job.groups[0].request
    assert (r.milli_cpu, r.mem_mib, r.gpu, r.gpu_milli) == (12_000, 16_384, 1, 0)
    assert tj.duration_s == 12_537_496.0


def test_openb_variants() -> None:
    _traces_dir()
    spec = load_openb_pods(variant="gpuspec33", limit=2_000)
    assert len(spec.jobs) == 2_000
    constrained = Counter(tj.job.gpu_models for tj in spec.jobs if tj.job.gpu_models)
    assert ("V100M16", "V100M32") in constrained
    assert ("T4",) in constrained

    multi = load_openb_pods(variant="multigpu50")
    assert len(multi.jobs) == 9_061
    _assert_well_ordered(multi)
    assert sum(1 for tj in multi.jobs if tj.job.num_gpus > 1) == 984
    assert all(math.isinf(tj.duration_s) for tj in multi.jobs)
    assert [tj.job.submit_time_s for tj in multi.jobs[:3]] == [0.0, 1.0, 2.0]

    unsorted = load_openb_pods(variant="gpushare20")  # rows not sorted in this file
    _assert_well_ordered(unsorted)


_POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("p1,1000,1024,2,500,,LS,Running,5,10,5", "gpu_milli"),
        ("p1,1000,1024,0,500,,LS,Running,5,10,5", "gpu_milli"),
        ("p1,lots,1024,1,1000,,LS,Running,5,10,5", "cpu_milli"),
        ("p1,1000,1024,1,1000,,Gold,Running,5,10,5", "qos"),
        ("p0,1000,1024,1,1000,,LS,Running,5,10,5", "name"),
        ("p1,1000,1024,1,1000,,LS,Running,-5,10,5", "creation_time"),
        ("p1,1000,1024,1,1000,,LS,Running,10,5,10", "deletion_time"),  # ran 1 s, silently
    ],
)
def test_openb_bad_row(tmp_path: Path, row: str, column: str) -> None:
    f = tmp_path / "pods.csv"
    f.write_text(_POD_HEADER + "p0,1000,1024,1,1000,,BE,Running,0,7,0\n" + row + "\n")
    with pytest.raises(TraceError) as info:
        load_openb_pods(f)
    assert str(info.value).startswith(f"{f}:3: column {column!r}: ")


def test_a_repeated_openb_node_name_is_refused_at_its_line(tmp_path: Path) -> None:
    f = tmp_path / "nodes.csv"  # it was said at line 0
    f.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1024,1,T4\nn0,1000,1024,1,T4\n")
    with pytest.raises(TraceError) as info:
        load_openb_nodes(f)
    assert str(info.value) == f"{f}:3: column 'sn': node name 'n0' repeats line 2"


def test_an_openb_node_with_more_gpus_than_a_cluster_file_allows_is_refused(
    tmp_path: Path,
) -> None:
    # 32,000 GPUs on one node hung the replay.
    f = tmp_path / "nodes.csv"
    f.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,8,T4\nn1,32000,262144,32000,T4\n"
    )
    with pytest.raises(TraceError) as info:
        load_openb_nodes(f)
    assert str(info.value) == f"{f}:3: column 'gpu': 32000 GPUs on one node (at most 1024)"


@pytest.mark.parametrize("kind", ["philly", "pods", "nodes"])
def test_a_byte_that_is_not_utf8_is_refused_with_its_line(tmp_path: Path, kind: str) -> None:
    """Many good lines first, so that a reader decoding ahead in blocks would meet the bad
    byte while still on an early line."""
    header, good, load = {
        "philly": (_PHILLY_HEADER, "2017-10-09 06:13:03,2951.0,1,2951.0,6214e9\n", load_philly),
        "pods": (_POD_HEADER, "p{},1000,1024,1,1000,,BE,Running,0,7,0\n", load_openb_pods),
        "nodes": (
            "sn,cpu_milli,memory_mib,gpu,model\n",
            "n{},32000,262144,1,T4\n",
            load_openb_nodes,
        ),
    }[kind]
    lines = "".join(good.format(n) for n in range(2000))
    f = tmp_path / f"{kind}.csv"
    f.write_bytes((header + lines).encode() + b"p\xff,1\n")
    with pytest.raises(TraceError) as info:
        load(f)
    assert str(info.value) == f"{f}:2002: not UTF-8 text (byte 2)"


def test_a_trace_file_whose_lines_end_in_cr_alone_reads_as_with_newlines(tmp_path: Path) -> None:
    rows = ["2017-10-09 07:00:00,20.0,1,20.0,bb", "2017-10-09 07:00:10,30.0,2,60.0,cc"]
    f = tmp_path / "philly.csv"
    f.write_bytes((_PHILLY_HEADER.strip() + "\r" + "\r".join(rows) + "\r").encode())
    crlf = tmp_path / "crlf.csv"
    crlf.write_bytes((_PHILLY_HEADER.strip() + "\r\n" + "\r\n".join(rows) + "\r\n").encode())
    want = [("philly-00000", 20.0), ("philly-00001", 30.0)]
    for path in (f, crlf):
        assert [(tj.job.id, tj.duration_s) for tj in load_philly(path).jobs] == want


def test_a_field_over_the_csv_size_limit_is_refused_with_its_line(tmp_path: Path) -> None:
    f = tmp_path / "philly.csv"
    f.write_text(_PHILLY_HEADER + "2017-10-09 07:00:00,20.0," + "9" * 200_000 + ",20.0,bb\n")
    with pytest.raises(TraceError) as info:
        load_philly(f)
    assert str(info.value) == f"{f}:2: not CSV: field larger than field limit (131072)"


def test_openb_small_file_without_node_list(tmp_path: Path) -> None:
    f = tmp_path / "pods.csv"
    f.write_text(
        _POD_HEADER
        + "b,1000,1024,1,250,T4|A10,BE,Running,100,100,\n"
        + "a,2000,0,0,0,,Burstable,Running,100,150,100\n"
        + "c,3000,512,4,1000,,Guaranteed,Running,90,200,90\n"
    )
    trace = load_openb_pods(f)
    assert trace.cluster is None
    got = [
        (tj.job.id, tj.job.submit_time_s, tj.duration_s, tj.job.kind, tj.job.gpu_models)
        for tj in trace.jobs
    ]
    assert got == [
        ("c", 0.0, 110.0, JobKind.INFER, ()),
        ("a", 10.0, 50.0, JobKind.BATCH, ()),
        ("b", 10.0, 1.0, JobKind.BATCH, ("T4", "A10")),  # zero lifetime counts as 1 s
    ]
    assert trace.jobs[2].job.groups[0].request.gpu_milli == 250


def test_openb_skip_invalid_and_a_custom_list_is_named_after_its_file(tmp_path: Path) -> None:
    f = tmp_path / "my-pods.csv"
    f.write_text(
        _POD_HEADER
        + "a,1000,1024,1,1000,,BE,Running,0,7,0\n"
        + "b,1000,1024,1,1000,,BE,Running,1.5,7,0\n"  # a fractional time
        + "c,1000,1024,1,1000,,BE,Running,2,,0\n"  # an empty one
        + "d,1000,1024,1,1000,,BE,Running,3,9,0\n"
    )
    with pytest.raises(TraceError):
        load_openb_pods(f)
    trace = load_openb_pods(f, skip_invalid=True)
    assert (trace.name, [tj.job.id for tj in trace.jobs]) == ("openb-my-pods", ["a", "d"])
    assert (trace.skipped, trace.first_skipped) == (
        2,
        f"{f}:3: column 'creation_time': expected a non-negative integer, got '1.5'",
    )
    huge = tmp_path / "huge.csv"  # numpy's int64 overflowed on it
    huge.write_text(_POD_HEADER + "a,1000,1024,99999999999999999999,1000,,LS,Running,0,7,0\n")
    with pytest.raises(
        TraceError, match=r"huge.csv:2: column 'num_gpu': 99999999999999999999 is too large"
    ):
        load_openb_pods(huge)
    named = tmp_path / "openb_pod_list_mine.csv"
    named.write_text(_POD_HEADER + "a,1000,1024,1,1000,,BE,Running,0,7,0\n")
    assert load_openb_pods(named).name == "openb-mine"


def test_simulate_skip_invalid_says_how_many_rows_it_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aisched.cli.main import main

    f = tmp_path / "philly.csv"
    f.write_text(
        _PHILLY_HEADER
        + "2017-10-09 07:00:00,20.0,1,20.0,bb\n"
        + "2017-10-09 07:00:05,20.0,0,0.0,bb\n"
    )
    argv = ["simulate", "--trace", str(f), "--cluster", "small", "--policy", "fifo"]
    assert main([*argv, "--no-progress"]) == 2
    assert "num_gpus" in capsys.readouterr().err
    assert main([*argv, "--no-progress", "--skip-invalid"]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        "skipped 1 row that cannot be used (--skip-invalid); the first: "
        f"{f}:3: column 'num_gpus': expected an integer from 1 to 1,000,000, got '0'"
    ]
    assert "trace philly: 1 jobs" in out.out


# --- finding the traces -------------------------------------------------------------------


def test_find_traces_dir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AISCHED_TRACES", str(tmp_path))
    assert find_traces_dir() == tmp_path
    monkeypatch.setenv("AISCHED_TRACES", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="AISCHED_TRACES"):
        find_traces_dir()


def test_missing_trace_file_is_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="philly.csv"):
        load_philly(tmp_path)


# --- synthetic ----------------------------------------------------------------------------


def test_synthetic_same_seed_same_trace() -> None:
    a = synthetic_trace(500, seed=7)
    assert a == synthetic_trace(500, seed=7)
    assert a != synthetic_trace(500, seed=8)
    assert synthetic_trace(0, seed=7).jobs == ()


def test_synthetic_shape() -> None:
    trace = synthetic_trace(4_000, seed=1)
    _assert_well_ordered(trace)
    jobs = [tj.job for tj in trace.jobs]
    assert all(j.estimate_s is not None and j.estimate_s > 0 for j in jobs)
    assert any(j.estimate_s != tj.duration_s for j, tj in zip(jobs, trace.jobs, strict=True))
    assert {j.priority for j in jobs} == {0, 10}
    assert 0.07 < sum(j.priority == 10 for j in jobs) / len(jobs) < 0.13
    assert {j.queue for j in jobs} == {"q0", "q1"}
    assert {j.user for j in jobs} == {f"u{k}" for k in range(8)}
    assert all(j.queue == f"q{int(j.user[1:]) % 2}" for j in jobs)
    # 60 jobs an hour: mean gap about a minute.
    mean_gap = jobs[-1].submit_time_s / (len(jobs) - 1)
    assert 54.0 < mean_gap < 66.0
    durations = sorted(tj.duration_s for tj in trace.jobs)
    assert 1_500.0 < durations[len(durations) // 2] < 2_200.0
    assert durations[-1] > 50 * 1_800.0  # heavy tail
    sizes = Counter(int(j.num_gpus) for j in jobs)
    assert set(sizes) == {1, 2, 4, 8, 16, 32}
    assert 0.66 < sizes[1] / len(jobs) < 0.74
    gang = next(j for j in jobs if j.num_gpus == 32)
    assert (gang.groups[0].replicas, gang.groups[0].request.gpu) == (4, 8)


def test_synthetic_exact_estimates_and_custom_sizes() -> None:
    trace = synthetic_trace(50, seed=3, estimate_noise=0.0, gpu_sizes=((2, 1.0),), num_queues=1)
    assert all(tj.job.estimate_s == tj.duration_s for tj in trace.jobs)
    assert {tj.job.num_gpus for tj in trace.jobs} == {2.0}
    assert {tj.job.queue for tj in trace.jobs} == {"q0"}
    with pytest.raises(ValueError):
        synthetic_trace(5, seed=1, gpu_sizes=())


def test_synthetic_cluster() -> None:
    c = synthetic_cluster(300)
    assert len(c.nodes) == 300
    assert c.total_gpus == 2_400
    n = c.nodes[130]
    assert (n.name, n.rack, n.zone) == ("node-00130", "rack-008", "zone-01")
    assert [g.nvlink_group for g in n.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert n.capacity.gpu_mem_mib == 8 * 81_920
    assert len({x.rack for x in c.nodes}) == math.ceil(300 / 16)
    cpu_only = synthetic_cluster(2, gpus_per_node=0)
    assert cpu_only.total_gpus == 0


def test_an_openb_pod_list_with_some_of_its_time_columns_is_refused(tmp_path: Path) -> None:
    # Without creation_time it replayed untimed, its qos and times dropped without a word.
    f = tmp_path / "pods.csv"
    f.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,deletion_time\n"
        "p0,1000,1024,1,1000,,BE,Running,7\n"
    )
    with pytest.raises(TraceError) as info:
        load_openb_pods(f)
    assert str(info.value).startswith(f"{f}:1: column 'creation_time': header lacks column(s) ")
