"""Quantile gradient boosting over numeric feature vectors, with a fast single-row path.

Fitting uses scikit-learn's `HistGradientBoostingRegressor` with the quantile loss. Predicting
one row through `predict` costs a Python call per tree (about a millisecond for 60 trees), and
the simulator asks once per arriving job, so the fitted trees are also copied into flat arrays
and walked for all trees at once with numpy (`_FlatTrees`). The copy reads the regressor's
fitted tree arrays, which are not a public interface: after every fit it is checked against
`predict` on sample rows and dropped (the slow path is used) if the two disagree, so a change in
scikit-learn can cost speed but never give a wrong answer.

Features are numeric; NaN means "unknown" (the trees learn which way it goes).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class QuantileModel:
    """A fitted model of one quantile of the target."""

    def __init__(self, regressor: Any, flat: _FlatTrees | None, columns: IntArray) -> None:
        self._regressor = regressor
        self._flat = flat
        self._columns = columns

    @classmethod
    def fit(
        cls,
        x: FloatArray,
        y: FloatArray,
        quantile: float,
        *,
        max_iter: int,
        max_depth: int,
        seed: int,
    ) -> QuantileModel:
        from sklearn.ensemble import HistGradientBoostingRegressor

        reg = HistGradientBoostingRegressor(
            loss="quantile",
            quantile=quantile,
            max_iter=max_iter,
            max_depth=max_depth,
            learning_rate=0.1,
            min_samples_leaf=20,
            early_stopping=False,
            random_state=seed,
        )
        # A column with fewer than two distinct known values cannot split anything, and
        # scikit-learn's binning fails on one that is all NaN: such columns are left out.
        columns = np.array([j for j in range(x.shape[1]) if _varies(x[:, j])], dtype=np.int64)
        x = x[:, columns]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reg.fit(x, y)
        flat = _FlatTrees.of(reg)
        if flat is not None:
            sample = x[: min(len(x), 64)]
            if not np.allclose(flat.predict_many(sample), reg.predict(sample), atol=1e-9):
                flat = None
        return cls(reg, flat, columns)

    @property
    def fast(self) -> bool:
        return self._flat is not None

    def predict_one(self, row: FloatArray) -> float:
        row = row[self._columns]
        if self._flat is not None:
            return self._flat.predict_one(row)
        return float(self._regressor.predict(row.reshape(1, -1))[0])


def _varies(column: FloatArray) -> bool:
    known = column[~np.isnan(column)]
    return len(known) > 1 and bool(known.min() < known.max())


class _FlatTrees:
    """All trees of a fitted regressor in one node table; children are absolute indices."""

    __slots__ = ("base", "feature", "threshold", "nan_left", "left", "right", "leaf", "value",
                 "roots", "depth")  # fmt: skip

    def __init__(self, base: float, nodes: list[Any]) -> None:
        offsets = np.cumsum([0] + [len(n) for n in nodes[:-1]])
        cat = np.concatenate(nodes)
        shift = np.concatenate(
            [np.full(len(n), o, dtype=np.int64) for n, o in zip(nodes, offsets, strict=True)]
        )
        self.base = base
        self.feature = cat["feature_idx"].astype(np.int64)
        self.threshold = cat["num_threshold"].astype(np.float64)
        self.nan_left = cat["missing_go_to_left"].astype(np.bool_)
        self.leaf = cat["is_leaf"].astype(np.bool_)
        self.left = cat["left"].astype(np.int64) + shift
        self.right = cat["right"].astype(np.int64) + shift
        # A leaf points at itself, so walking past it stays on it.
        idx = np.arange(len(cat), dtype=np.int64)
        self.left[self.leaf] = idx[self.leaf]
        self.right[self.leaf] = idx[self.leaf]
        self.feature[self.leaf] = 0
        self.value = cat["value"].astype(np.float64)
        self.roots = offsets.astype(np.int64)
        self.depth = int(cat["depth"].max()) if len(cat) else 0

    @classmethod
    def of(cls, reg: Any) -> _FlatTrees | None:
        try:
            predictors = reg._predictors
            base = float(np.asarray(reg._baseline_prediction).ravel()[0])
            nodes = [p[0].nodes for p in predictors]
            if not nodes or any(n["is_categorical"].any() for n in nodes):
                return None
            return cls(base, nodes)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            return None

    def predict_one(self, row: FloatArray) -> float:
        at = self.roots
        for _ in range(self.depth):
            x = row[self.feature[at]]
            go_left = np.where(np.isnan(x), self.nan_left[at], x <= self.threshold[at])
            at = np.where(go_left, self.left[at], self.right[at])
        return self.base + float(self.value[at].sum())

    def predict_many(self, rows: FloatArray) -> FloatArray:
        return np.array([self.predict_one(r) for r in rows], dtype=np.float64)
