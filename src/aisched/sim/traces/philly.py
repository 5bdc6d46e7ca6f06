"""Loader for the Microsoft Philly per-job table (`philly-pollux/philly.csv`).

Each row becomes one training `Job` in the queue of its virtual cluster. The file's rows are not
sorted; the loader sorts them by submission time, ties kept in file order, and numbers the jobs
`philly-00000`, ... in that order over the whole file, so an id names the same job whatever
`limit` or `min_duration_s` keep. Arrival times are wall-clock differences from the first kept
job. The trace's stamps carry no time zone (so no daylight-saving jumps) and are taken as they
are; a stamp with an offset (`+02:00`, `Z`) is converted to UTC first, so a file that mixes the
two reads its naive stamps as UTC. The trace records no user estimate, so `estimate_s` is None.

The trace gives only a GPU count; `gpu_train_job` turns it into a gang (Philly servers held 8
GPUs, so more than 8 GPUs is a gang of several replicas).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from aisched.sim.traces.base import (
    Trace,
    TraceError,
    TraceJob,
    gpu_train_job,
    open_csv,
    resolve_trace_file,
)

_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
# Past these a row is no job (31 years; a million GPUs): 1e308 s made every figure of the run
# garbage, and 1e20 GPUs stopped it with an overflow in the placement.
MAX_DURATION_S = 1e9
MAX_JOB_GPUS = 1_000_000
_EPOCH = datetime(1970, 1, 1)


def load_philly(
    path: Path | None = None,
    *,
    limit: int | None = None,
    min_duration_s: float = 0.0,
    skip_invalid: bool = False,
) -> Trace:
    """Read the Philly trace; `path` is the CSV or its folder (default: the shared traces).
    With `skip_invalid`, a row it cannot use (a job of 0 GPUs, a duration that is not a
    positive number, ...) is left out and counted in `Trace.skipped` instead of refusing the
    whole trace; skipped rows get no id."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    file = resolve_trace_file(path, "philly-pollux", "philly.csv")
    rows: list[tuple[float, int, float, int, str]] = []
    skipped: list[TraceError] = []
    # Jobs submitted in the same second share a stamp; each distinct stamp is parsed once.
    stamps: dict[str, float] = {}
    with open_csv(file) as reader:
        header = next(reader, None)
        if header is None:
            raise TraceError(file, 1, "timestamp", "file is empty, expected a header row")
        idx = _column_indices(file, header)
        width = len(header)
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            try:
                parsed = _row(file, reader.line_num, row, width, header, idx, stamps)
            except TraceError as e:
                if not skip_invalid:
                    raise
                skipped.append(e)
                continue
            rows.append((parsed[0], len(rows), *parsed[1:]))

    rows.sort(key=lambda r: (r[0], r[1]))
    kept = [(n, r) for n, r in enumerate(rows) if r[2] >= min_duration_s]
    if limit is not None:
        kept = kept[:limit]
    t0 = kept[0][1][0] if kept else 0.0
    jobs = tuple(
        TraceJob(
            job=gpu_train_job(
                f"philly-{n:05d}", gpus, user=f"vc-{vc}", queue=f"vc-{vc}", submit_time_s=t - t0
            ),
            duration_s=duration,
            source="philly",
        )
        for n, (t, _, duration, gpus, vc) in kept
    )
    return Trace(
        name="philly",
        jobs=jobs,
        skipped=len(skipped),
        first_skipped=str(skipped[0]) if skipped else None,
    )


def _row(
    file: Path,
    line: int,
    row: list[str],
    width: int,
    header: list[str],
    idx: dict[str, int],
    stamps: dict[str, float],
) -> tuple[float, float, int, str]:
    """(submit time, duration, GPUs, VC) of one row, or `TraceError` saying what is wrong."""
    i_ts, i_dur, i_gpu, i_vc = (idx[c] for c in _COLUMNS)
    if len(row) != width:
        raise TraceError(
            file,
            line,
            header[min(len(row), width - 1)],
            f"expected {width} fields, found {len(row)}",
        )
    ts = row[i_ts]
    t = stamps.get(ts)
    if t is None:
        try:
            t = _seconds_since_epoch(datetime.fromisoformat(ts))
        except ValueError:
            raise TraceError(
                file, line, "timestamp", f"expected YYYY-MM-DD HH:MM:SS, got {ts!r}"
            ) from None
        stamps[ts] = t
    try:
        duration = float(row[i_dur])
    except ValueError:
        duration = float("nan")
    if not 0.0 < duration <= MAX_DURATION_S:
        raise TraceError(
            file,
            line,
            "duration",
            f"expected a positive number of seconds up to {MAX_DURATION_S:.0e}, got {row[i_dur]!r}",
        )
    try:
        gpus = int(row[i_gpu])
    except ValueError:
        gpus = 0
    if not 1 <= gpus <= MAX_JOB_GPUS:
        raise TraceError(
            file,
            line,
            "num_gpus",
            f"expected an integer from 1 to {MAX_JOB_GPUS:,}, got {row[i_gpu]!r}",
        )
    vc = row[i_vc].strip()
    if not vc:
        raise TraceError(file, line, "cluster", "empty virtual-cluster id")
    return t, duration, gpus, vc


def _seconds_since_epoch(stamp: datetime) -> float:
    """Seconds from 1970-01-01 00:00 UTC; a naive stamp is read as UTC. (Subtracting a naive
    epoch from an aware stamp raised TypeError, a traceback past --skip-invalid.)"""
    offset = stamp.utcoffset()
    naive = stamp.replace(tzinfo=None)
    # Timedelta arithmetic, not astimezone: that overflows on stamps near year 1 or 9999.
    return (naive - _EPOCH - (offset or timedelta(0))).total_seconds()


def _column_indices(file: Path, header: list[str]) -> dict[str, int]:
    names = [h.strip() for h in header]
    missing = [c for c in _COLUMNS if c not in names]
    if missing:
        raise TraceError(
            file, 1, missing[0], f"header lacks column(s) {', '.join(missing)}; found {names}"
        )
    return {c: names.index(c) for c in _COLUMNS}
