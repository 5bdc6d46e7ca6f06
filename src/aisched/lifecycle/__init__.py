"""What happens to a job between the core's decisions: the one set of rules both drivers use.

The core (`run_cycle`) decides binds, preemptions and shrinks. Everything after a decision is
here, written once: which state a job may move to (`states`), why an attempt is stopped and
what the job becomes once it has (`attempts`: restart policy, bounded retries with backoff,
preemption, shrink, growth, time limits, cancellation), how much work an attempt keeps through
its checkpoints and how long the next one is expected to take (`work`), when an elastic job is
grown (`elastic`), how a service's replicas are made (`services`), how long a preemption's
victims may take to stop and how long the job they make room for waits (`preemption`), which
jobs are refused because they can never run (`admission`), and the resources held by running
attempts, with the view the core sees of them (`holdings`, with a validate mode).

Dependencies between jobs (pipelines) are judged by the pure `core.dependencies`, which both
drivers call directly.

Two drivers feed it: the simulator's event loop (`sim.engine`: virtual clock, simulated task
ends) and the service's loop (`service.loop`: real clock, real executor, the store). Each keeps
only what is its own: the event queue and metrics in one; commands, persistence and executors
in the other. Neither keeps a rule of its own about a job's life.

Pure, like the core: no I/O, no clock (every function is given `now`), no randomness. Nothing
here imports a driver.
"""
