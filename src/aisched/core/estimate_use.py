"""Whether a policy's decisions can depend on runtime estimates at all.

A runtime estimate (`PendingJob.estimate_s`/`estimate_upper_s`, and a running job's
`expected_end_s` derived from it) is read only by some plugins and actions: the orders that sort
by predicted time (sjf, qssf), the victims that rank by time left (longest-remaining), the
score that sends long jobs to fast GPUs (hetero), and every action that plans with running
jobs' ends (backfill, eta, and enqueue when it promotes starving jobs, whose reservation then
guards allocate, or when its overdue bar follows the backlog's drain time). A policy made only
of the others decides the same whatever the estimates are, so a caller need not learn any (the
simulator's `--estimator auto` trains nothing then).

Invariant: an action or plugin is counted as blind to estimates only when it is listed here by
class (and, for enqueue, only with starving promotion and the backlog bar off). Anything else,
a new plugin included, counts as reading them: forgetting to list one costs time, never a wrong
decision.
"""

from __future__ import annotations

from aisched.core.actions.allocate import Allocate
from aisched.core.actions.enqueue import Enqueue
from aisched.core.actions.preempt import Preempt, Reclaim
from aisched.core.plugins import fragmentation, hetero, order, packing, roles, score, victims
from aisched.core.policy import Policy

# Allocate reserves only for jobs enqueue promoted (counted with enqueue). Preempt reads an
# estimate only through the policy's first order key, which is checked as an order.
_BLIND_ACTIONS: tuple[type, ...] = (Allocate, Preempt, Reclaim)
_BLIND_ORDERS: tuple[type, ...] = order.BLIND_TO_ESTIMATES
_BLIND_VICTIMS: tuple[type, ...] = (victims.LowestPriority, victims.LeastWorkLost, victims.Newest)
_BLIND_SCORES: tuple[type, ...] = (
    score.BinPack,
    score.Spread,
    score.TopologyLocality,
    fragmentation.Fragmentation,
    packing.BestFit,
    packing.WorstFit,
    packing.DotProduct,
    packing.RandomFit,
    hetero.PreferredModel,
)
# Filters see the job and the node only; the one there is reads no estimate.
_BLIND_FILTERS: tuple[type, ...] = (roles.NodeRole,)


def reads_estimates(policy: Policy) -> bool:
    """True when some decision of `policy` may change with the runtime estimates given."""
    for action in policy.actions:
        if isinstance(action, Enqueue):
            if action.promotes or action.due_after_backlog > 0:
                return True
        elif type(action) not in _BLIND_ACTIONS:
            return True
    if any(type(o) not in _BLIND_ORDERS for o in policy.order):
        return True
    if any(type(v) not in _BLIND_VICTIMS for v in policy.victims):
        return True
    if any(type(ws.plugin) not in _BLIND_SCORES for ws in policy.scores):
        return True
    return any(type(f) not in _BLIND_FILTERS for f in policy.filters)
