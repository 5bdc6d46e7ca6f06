"""Runtime prediction learned from finished jobs.

The simulator and the service feed a `RuntimePredictor` with every job that finishes
(`observe`) and ask it for each job that becomes pending (`predict`); the answer is attached to
the job as `PendingJob.estimate_s` / `estimate_upper_s` before the cycle. The core never calls
this package.
"""

from aisched.predict.features import JobFeatures, name_key
from aisched.predict.runtime import (
    LeakageError,
    Prediction,
    PredictorConfig,
    PredictorStats,
    RuntimePredictor,
)

__all__ = [
    "JobFeatures",
    "LeakageError",
    "Prediction",
    "PredictorConfig",
    "PredictorStats",
    "RuntimePredictor",
    "name_key",
]
