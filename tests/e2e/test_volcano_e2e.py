"""End to end: Volcano Job files submitted to the real service by the real CLI, run as real
tasks, and what the user is told about them."""

from __future__ import annotations

import sys
import textwrap

from harness import Service

PY = sys.executable


def submit(service: Service, name: str, text: str) -> tuple[str, str]:
    """Submit the file; its job's id, and what the CLI wrote to stderr (the warnings)."""
    (service.work / name).write_text(textwrap.dedent(text))
    proc = service.cli("submit", name)
    return proc.stdout.split()[0], " ".join(proc.stderr.split())  # as one line, unwrapped


def test_a_job_started_short_of_its_tasks_is_warned_about_and_says_how_many_ran(
    service: Service,
) -> None:
    """minAvailable 1 of 4 tasks of 2 CPUs on 4 CPUs: 2 start, the other 2 never do. The file
    was accepted without a word and the job reported `all tasks exited with code 0`."""
    jid, err = submit(
        service,
        "short.yaml",
        f"""
        apiVersion: batch.volcano.sh/v1alpha1
        kind: Job
        metadata: {{name: short}}
        spec:
          minAvailable: 1
          tasks:
            - replicas: 4
              template:
                spec:
                  restartPolicy: Never
                  containers:
                    - command: [{PY}, -c, "pass"]
                      resources: {{requests: {{cpu: 2}}}}
        """,
    )
    assert (
        "spec.minAvailable: 1 of the job's 4 tasks: aisched starts as many of the 4 tasks as "
        "fit at once (at least 1) and never starts the others later, as Volcano does"
    ) in err
    done = service.wait_state(jid, "succeeded", "failed")
    assert (done["state"], done["message"]) == (
        "succeeded",
        "all 2 tasks that started (of 4) exited with code 0",
    )
    shown = " ".join(service.cli("show", jid).stdout.split())
    assert "attempt 1: 2 of its 4 tasks started" in shown
    assert "result all 2 tasks that started (of 4) exited with code 0" in shown


def test_dollar_names_in_command_args_and_env_are_expanded_as_kubernetes_does(
    service: Service,
) -> None:
    """`--rank=$(VC_TASK_INDEX)` reached the task as written, and in `sh -c 'echo
    $(VC_TASK_INDEX)'` the shell ran VC_TASK_INDEX as a command."""
    jid, _ = submit(
        service,
        "expand.yaml",
        f"""
        apiVersion: batch.volcano.sh/v1alpha1
        kind: Job
        metadata: {{name: expand}}
        spec:
          tasks:
            - replicas: 2
              template:
                spec:
                  restartPolicy: Never
                  containers:
                    - command: [{PY}, -c, "import sys; print(*sys.argv[1:])"]
                      args: ["--rank=$(VC_TASK_INDEX)", "--of=$(WORLD_SIZE)", "$(OUT)",
                             "$$(VC_TASK_INDEX)", "$(UNSET)"]
                      env:
                        - {{name: BASE, value: /data}}
                        - {{name: OUT, value: "$(BASE)/out"}}
                      resources: {{requests: {{cpu: 1}}}}
            - name: shell
              template:
                spec:
                  restartPolicy: Never
                  containers:
                    - command: [sh, -c, "echo task $(VC_TASK_INDEX) of $(WORLD_SIZE)"]
                      resources: {{requests: {{cpu: 1}}}}
        """,
    )
    assert service.wait_state(jid, "succeeded", "failed")["state"] == "succeeded"
    assert [service.cli("logs", jid, "--task", t).stdout for t in ("default0-0", "default0-1")] == [
        f"--rank={i} --of=3 /data/out $(VC_TASK_INDEX) $(UNSET)\n" for i in (0, 1)
    ]
    assert service.cli("logs", jid, "--task", "shell-0").stdout == "task 0 of 3\n"


def test_a_command_too_large_once_expanded_is_refused_or_fails_with_the_reason(
    service: Service,
) -> None:
    """`$(NAME)` could make a word larger than the kernel starts, after the file's checks: the
    job failed with exec's `Argument list too long`, said of the program, and was retried."""
    (service.work / "big.yaml").write_text(
        textwrap.dedent(
            f"""
            apiVersion: batch.volcano.sh/v1alpha1
            kind: Job
            metadata: {{name: big}}
            spec:
              tasks:
                - template:
                    spec:
                      containers:
                        - command: [{PY}, -c, "pass"]
                          args: ["$(A)$(A)"]
                          env: [{{name: A, value: {"x" * 100_000}}}]
            """
        )
    )
    refused = service.cli("submit", "big.yaml", check=False)
    assert refused.returncode != 0
    assert (
        "big.yaml: spec.tasks.0.template.spec.containers.0.args.0: is 200,000 bytes once "
        "$(NAME) is expanded: a program gets at most 130,048 bytes in each argument or "
        "variable (the kernel's limit)"
    ) in " ".join(refused.stderr.split())
    assert service.cli_json("jobs", "--all")["jobs"] == []

    # A name the scheduler sets is known at the launch only.
    jid, _ = submit(
        service,
        "late.yaml",
        f"""
        apiVersion: batch.volcano.sh/v1alpha1
        kind: Job
        metadata: {{name: late}}
        spec:
          tasks:
            - template:
                spec:
                  containers:
                    - command: [{PY}, -c, "pass"]
                      args: ["{"$(AISCHED_CHECKPOINT_DIR)" * 5000}"]
                      resources: {{requests: {{cpu: 1}}}}
        """,
    )
    done = service.wait_state(jid, "succeeded", "failed")
    size = 5000 * len(done["checkpoint_dir"])
    assert (done["state"], done["failures"], done["message"]) == (
        "failed",
        1,
        "task default0-0 could not start: task default0-0: word 3 of its command (command "
        f"then args, from 0) is {size:,} bytes once $(NAME) is expanded: a program gets at "
        "most 130,048 bytes in each argument or variable (the kernel's limit); not retried",
    )


def test_what_the_file_gets_wrong_is_refused_by_the_cli_at_its_field(service: Service) -> None:
    """An unknown queue (spec.queue, or a Kueue or KAI label without it), a preemptable label
    that is no boolean, a request above its limit and a pytorch master task of several
    replicas are refused through `aisched submit` at their fields, and no job is made."""
    task = f"""
            - name: {{name}}
              replicas: {{replicas}}
              template:
                spec:
                  containers:
                    - command: [{PY}, -c, "pass"]
                      resources: {{{{requests: {{{{cpu: {{cpu}}}}}}, limits: {{{{cpu: 1}}}}}}}}"""

    def volcano(meta: str, spec: str, *tasks: tuple[str, int, int]) -> str:
        listed = "".join(task.format(name=n, replicas=r, cpu=c) for n, r, c in tasks)
        head = f"apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {meta}\n"
        return f"{head}spec:\n{spec}  tasks:{listed}\n"

    cases = {
        "queue.yaml": (
            volcano("{name: q}", "  queue: research\n", ("w", 1, 1)),
            ["queue.yaml: spec.queue: unknown queue 'research'"],
        ),
        "label.yaml": (
            volcano("{name: l, labels: {kai.scheduler/queue: research}}", "", ("w", 1, 1)),
            ["label.yaml: metadata.labels.kai.scheduler/queue: unknown queue 'research'"],
        ),
        "kueue.yaml": (
            volcano("{name: k, labels: {kueue.x-k8s.io/queue-name: research}}", "", ("w", 1, 1)),
            ["kueue.yaml: metadata.labels.kueue.x-k8s.io/queue-name: unknown queue 'research'"],
        ),
        "preempt.yaml": (
            volcano("{name: p, labels: {volcano.sh/preemptable: maybe}}", "", ("w", 1, 1)),
            [
                'preempt.yaml: metadata.labels.volcano.sh/preemptable: expected "true" or '
                "\"false\", got 'maybe' (a string)"
            ],
        ),
        "request.yaml": (
            volcano("{name: r}", "", ("w", 1, 2)),
            [
                "request.yaml: spec.tasks.0.template.spec.containers.0.resources.requests.cpu: "
                "2 is more than its limit (1): a request must be less than or equal to the limit"
            ],
        ),
        "ddp.yaml": (
            volcano("{name: d}", "  plugins: {pytorch: []}\n", ("worker", 2, 1), ("master", 2, 1)),
            [
                "ddp.yaml: spec.tasks.1.replicas: 2 replicas of the pytorch plugin's master task "
                "'master': it is one process (the plugin gives each replica RANK 0 and its "
                "workers RANK 1 on); give it 1 replica and the others to the worker task 'worker'"
            ],
        ),
    }
    for name, (text, want) in cases.items():
        (service.work / name).write_text(text)
        proc = service.cli("submit", name, check=False)
        assert proc.returncode != 0, (name, proc.stdout)
        said = " ".join(proc.stderr.split())
        for line in want:
            assert line in said, (name, said)
    assert service.cli_json("jobs", "--all")["jobs"] == []


def test_what_the_file_asks_for_that_is_ignored_is_warned_about_by_the_cli(
    service: Service,
) -> None:
    """Through `aisched submit`: a KAI scheduler queue label names the queue, and
    topologySpreadConstraints is warned about, as affinity is."""
    jid, err = submit(
        service,
        "spread.yaml",
        f"""
        apiVersion: batch.volcano.sh/v1alpha1
        kind: Job
        metadata:
          name: spread
          labels: {{kai.scheduler/queue: default, volcano.sh/preemptable: "false"}}
        spec:
          tasks:
            - template:
                spec:
                  restartPolicy: Never
                  topologySpreadConstraints: [{{maxSkew: 1, topologyKey: zone}}]
                  containers: [{{command: [{PY}, -c, "pass"]}}]
        """,
    )
    assert (
        "spread.yaml: spec.tasks.0.template.spec.topologySpreadConstraints: ignored: aisched "
        "does not place tasks by node labels or affinity"
    ) in err
    done = service.wait_state(jid, "succeeded", "failed")
    assert (done["state"], done["queue"]) == ("succeeded", "default")
