"""What the predictor knows about a job: the fields of its spec that hint at its runtime, and
when the question is asked.

`JobFeatures` is plain data, built from a `Job` (`from_job`) by the simulator and the service
alike. `now_s` is the time of the question: the predictor must not use any job that finished
after it. Nothing here reads a clock; times are on the caller's clock (virtual seconds in the
simulator, epoch seconds in the service).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aisched.model.job import Job

_DIGITS = re.compile(r"[0-9]+")
_SEPARATORS = re.compile(r"[^a-z]+")


def name_key(name: str) -> str:
    """A job name with its numbers and punctuation dropped, so the runs of one sweep share a key
    (`bert-lr0.01-seed3` and `bert-lr0.1-seed4` both give `bert-lr-seed`); "" for no name."""
    words = _SEPARATORS.split(_DIGITS.sub("", name.lower()))
    return "-".join(w for w in words if w)


@dataclass(frozen=True, slots=True)
class JobFeatures:
    """One job as the predictor sees it. `gpus` counts shares as fractions; `submit_s` and
    `now_s` are on the caller's clock, `now_s` being when the prediction is asked for."""

    job_id: str
    user: str
    queue: str
    name: str
    kind: str
    gpus: float
    tasks: int
    submit_s: float
    now_s: float
    # The user's own estimate of the runtime, if the job gave one: what the predictor answers
    # instead of a guess, until enough jobs of its name have finished.
    estimate_s: float | None = None

    @classmethod
    def from_job(cls, job: Job, now_s: float) -> JobFeatures:
        return cls(
            job_id=job.id,
            user=job.user,
            queue=job.queue,
            name=name_key(job.name),
            kind=str(job.kind),
            gpus=job.num_gpus,
            tasks=job.num_tasks,
            submit_s=job.submit_time_s,
            now_s=now_s,
            estimate_s=job.estimate_s,
        )
