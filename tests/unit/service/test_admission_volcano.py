"""Paths found wrong at submission in a Volcano file are named as the file wrote them, also
when its groups are not in file order (the pytorch plugin's master first)."""

from __future__ import annotations

from pathlib import Path

from aisched.service.admission import path_problems
from aisched.spec import parse_job_text

DDP = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {{name: ddp}}
spec:
  plugins: {{pytorch: []}}
  tasks:
    - name: worker
      template: {{spec: {{containers: [{{command: [python, t.py]}}]}}}}
    - name: master
      template: {{spec: {{containers: [{{command: [python, t.py], workingDir: {missing}}}]}}}}
"""


def test_a_moved_master_tasks_problem_is_named_at_its_place_in_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "none"
    job = parse_job_text(DDP.format(missing=missing), "ddp.yaml").job
    assert [g.name for g in job.groups] == ["master", "worker"]
    assert path_problems([job], "ddp.yaml", None, ["volcano"]) == [
        f"ddp.yaml: spec.tasks.1.template.spec.containers.0.workingDir: no such directory: "
        f"{missing}"
    ]
