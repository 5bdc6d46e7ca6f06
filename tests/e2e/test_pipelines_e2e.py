"""End to end: pipelines submitted as one file through the real CLI to the real service.

Steps record their order in a file of the work directory; each step also checks that what its
dependency wrote is there, so a step started too early fails instead of passing by luck.
"""

from __future__ import annotations

import re
import sys
import textwrap

from harness import Service, wait_for

PY = sys.executable

STEP = textwrap.dedent(
    """
    import os, sys
    name, needs, code = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if needs != "-" and not os.path.exists(f"done-{needs}"):
        sys.exit(f"{name} started before {needs} was done")
    with open("order.log", "a") as f:
        f.write(name + "\\n")
    if code == 0:
        open(f"done-{name}", "w").close()
    sys.exit(code)
    """
)


def pipeline(fail_prep: bool = False) -> str:
    return textwrap.dedent(
        f"""
        name: prep
        command: [{PY}, step.py, prep, "-", "{3 if fail_prep else 0}"]
        restart: {{policy: never}}
        ---
        name: train
        command: [{PY}, step.py, train, prep, "0"]
        depends_on: [prep]
        ---
        name: serve
        command: [{PY}, step.py, serve, train, "0"]
        depends_on: [train]
        ---
        name: report
        command: [{PY}, step.py, report, "-", "0"]
        depends_on: [{{job: prep, condition: any}}]
        """
    )


def submit(service: Service, text: str) -> dict[str, str]:
    (service.work / "step.py").write_text(STEP)
    (service.work / "pipeline.yaml").write_text(text)
    out = service.cli("submit", "pipeline.yaml").stdout.split()
    return dict(zip(out[1::2], out[0::2], strict=True))  # name -> id


def test_a_three_step_pipeline_runs_in_order_as_one_file(service: Service) -> None:
    ids = submit(service, pipeline())
    assert list(ids) == ["prep", "train", "serve", "report"]
    for name in ("prep", "train", "serve", "report"):
        assert service.wait_state(ids[name], "succeeded", "failed", "cancelled")["state"] == (
            "succeeded"
        ), service.cli("logs", ids[name]).stdout
    order = (service.work / "order.log").read_text().split()
    assert [n for n in order if n != "report"] == ["prep", "train", "serve"]
    shown = service.cli("show", ids["serve"]).stdout
    assert re.search(rf"depends on +{ids['train']} \(to succeed\)", shown), shown


def test_a_followed_pipeline_says_every_steps_id(service: Service) -> None:
    """`submit PIPELINE -f` followed the last step and printed no id of the others, whose
    logs could then not be read."""
    (service.work / "step.py").write_text(STEP)
    (service.work / "pipeline.yaml").write_text(pipeline())
    done = service.cli("submit", "-f", "pipeline.yaml")
    said = re.findall(r"^submitted job (\d+) (\w+)$", done.stderr, re.M)
    assert [name for _, name in said] == ["prep", "train", "serve"], done.stderr
    assert re.search(r"^submitted job \d+; following its logs", done.stderr, re.M)
    for job_id, name in said:
        assert service.job(job_id)["name"] == name


def test_a_failed_step_cancels_what_depends_on_it_naming_the_failure(service: Service) -> None:
    ids = submit(service, pipeline(fail_prep=True))
    assert service.wait_state(ids["prep"], "failed", "succeeded")["state"] == "failed"
    train = service.wait_state(ids["train"], "cancelled", "failed", "succeeded")
    serve = service.wait_state(ids["serve"], "cancelled", "failed", "succeeded")
    assert (train["state"], train["message"]) == (
        "cancelled",
        f"dependency {ids['prep']} (prep) failed; it had to succeed",
    )
    assert (serve["state"], serve["message"]) == (
        "cancelled",
        f"dependency {ids['train']} (train) cancelled; it had to succeed",
    )
    # `condition: any` runs after a failure too.
    assert service.wait_state(ids["report"], "succeeded", "failed")["state"] == "succeeded"
    assert "train" not in (service.work / "order.log").read_text().split()


def test_a_waiting_step_shows_why_and_bad_pipelines_create_nothing(service: Service) -> None:
    (service.work / "hold.py").write_text(
        "import os, time\nwhile not os.path.exists('release'): time.sleep(0.05)\n"
    )
    (service.work / "p.yaml").write_text(
        f"jobs:\n  - {{name: first, command: [{PY}, hold.py]}}\n"
        f"  - {{name: second, command: [{PY}, hold.py], depends_on: [first]}}\n"
    )
    first, _, second, _ = service.cli("submit", "p.yaml").stdout.split()
    service.wait_state(first, "running")
    shown = service.cli("show", second).stdout
    assert re.search(rf"waiting because +waiting for job {first} \(first\) to succeed", shown)
    before = service.cli_json("jobs", "--all")["jobs"]
    (service.work / "bad.yaml").write_text(
        f"jobs:\n  - {{name: a, command: [{PY}, hold.py], depends_on: [b]}}\n"
        f"  - {{name: b, command: [{PY}, hold.py], depends_on: [a]}}\n"
        "---\n"
    )
    bad = service.cli("submit", "bad.yaml", check=False)
    assert bad.returncode != 0
    assert "bad.yaml: depends_on: dependency cycle: a -> b -> a" in bad.stderr
    (service.work / "unknown.yaml").write_text(
        f"jobs:\n  - {{name: a, command: [{PY}, hold.py]}}\n"
        f"  - {{name: b, command: [{PY}, hold.py], depends_on: ['999']}}\n"
    )
    unknown = service.cli("submit", "unknown.yaml", check=False)
    assert unknown.returncode != 0
    assert "unknown.yaml: job 'b': depends_on.0: no job '999'" in unknown.stderr
    assert service.cli_json("jobs", "--all")["jobs"] == before
    (service.work / "release").touch()
    assert service.wait_state(second, "succeeded", "failed")["state"] == "succeeded"


def test_a_step_that_ends_while_the_service_is_down_releases_the_next_after_a_restart(
    service: Service,
) -> None:
    # prep ends (exit 0) while `aisched up` is killed; the restart adopts its end and must see
    # it ended when it re-checks train, not the "running" its store row still said.
    (service.work / "hold.py").write_text(
        "import os, time\nwhile not os.path.exists('release'): time.sleep(0.05)\n"
        "open('done-prep', 'w').close()\n"
    )
    ids = submit(
        service,
        textwrap.dedent(
            f"""
            name: prep
            command: [{PY}, hold.py]
            ---
            name: train
            command: [{PY}, step.py, train, prep, "0"]
            depends_on: [prep]
            ---
            name: serve
            command: [{PY}, step.py, serve, train, "0"]
            depends_on: [train]
            """
        ),
    )
    service.wait_state(ids["prep"], "running")
    service.kill9()
    (service.work / "release").touch()
    exited = service.home / "tasks" / ids["prep"] / "1" / "main-0" / "exit.json"
    wait_for("prep to end while the service is down", exited.exists)
    service.start()
    for name in ("prep", "train", "serve"):
        assert service.wait_state(ids[name], "succeeded", "failed", "cancelled")["state"] == (
            "succeeded"
        ), service.cli("show", ids[name]).stdout
    assert (service.work / "order.log").read_text().split() == ["train", "serve"]
