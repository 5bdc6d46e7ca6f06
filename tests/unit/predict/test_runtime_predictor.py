"""The runtime predictor: fallbacks, the learned model, determinism and the leakage guard."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from aisched.predict import JobFeatures, LeakageError, PredictorConfig, RuntimePredictor, name_key
from aisched.predict.model import QuantileModel
from aisched.testing import job


def feats(
    job_id: str, *, user: str = "u", gpus: int = 1, now: float = 0.0, name: str = ""
) -> JobFeatures:
    j = job(job_id).task(gpu=gpus).user(user).submitted(now).build()
    f = JobFeatures.from_job(j, now)
    return JobFeatures(f.job_id, f.user, f.queue, name_key(name), f.kind, f.gpus, f.tasks, now, now)


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("bert-lr0.01-seed3", "bert-lr-seed"),
        ("BERT_lr0.1_seed4", "bert-lr-seed"),
        ("resnet50", "resnet"),
        ("", ""),
        ("1234", ""),
    ],
)
def test_name_key_drops_numbers_and_punctuation(name: str, want: str) -> None:
    assert name_key(name) == want


def test_from_job_takes_the_spec_fields() -> None:
    j = job("j").gang(2, gpu=4).user("alice").queue("q").submitted(7.0).build()
    assert JobFeatures.from_job(j, 9.0) == JobFeatures(
        "j", "alice", "q", "", "batch", 8.0, 2, 7.0, 9.0
    )


def test_no_history_gives_the_prior() -> None:
    p = RuntimePredictor(PredictorConfig(prior_s=600.0, upper_factor=4.0))
    got = p.predict(feats("a"))
    assert (got.median_s, got.upper_s, got.source) == (
        pytest.approx(600.0),
        pytest.approx(2400.0),
        "prior",
    )


def test_history_of_the_same_user_and_gpu_count_comes_first() -> None:
    p = RuntimePredictor()
    for i, runtime in enumerate([100.0, 200.0, 300.0]):
        p.observe(feats(f"a{i}", user="alice", gpus=2), runtime, finished_s=float(i))
    for i in range(3):
        p.observe(feats(f"b{i}", user="bob", gpus=2), 9000.0, finished_s=10.0 + i)
    got = p.predict(feats("new", user="alice", gpus=2, now=20.0))
    assert (got.median_s, got.source) == (pytest.approx(200.0), "history:user-gpus")
    # Another GPU count of alice's: her history in general.
    assert p.predict(feats("n2", user="alice", gpus=8, now=20.0)).source == "history:user"
    # A user not seen yet: her queue's history (everyone here shares the default queue).
    assert p.predict(feats("n3", user="carol", now=20.0)).source == "history:queue"


def test_the_users_estimate_beats_a_history_of_too_few_similar_jobs() -> None:
    """Three 1-second jobs say little about a `sleep 30` whose user said 30 s: with fewer than
    `min_similar` similar jobs behind it, the answer is the user's estimate (source own)."""
    p = RuntimePredictor(PredictorConfig(min_similar=5))
    for i in range(3):
        p.observe(feats(f"short{i}", user="alice"), 1.0, finished_s=float(i))
    told = replace(feats("sleep", user="alice", now=10.0), estimate_s=30.0)
    got = p.predict(told)
    assert (got.median_s, got.upper_s, got.source) == (
        pytest.approx(30.0),
        pytest.approx(30.0),
        "own",
    )
    # Without an estimate the history answers, however thin.
    assert p.predict(feats("other", user="alice", now=10.0)).source == "history:user-gpus"
    # With the prior alone, too.
    fresh = RuntimePredictor()
    assert fresh.predict(replace(feats("a"), estimate_s=90.0)).source == "own"
    # Enough similar jobs: the history wins over the user's word.
    for i in range(3, 6):
        p.observe(feats(f"short{i}", user="alice", now=10.0), 1.0, finished_s=10.0 + i)
    again = replace(feats("sleep2", user="alice", now=20.0), estimate_s=30.0)
    assert p.predict(again).source == "history:user-gpus"


def test_only_jobs_of_the_same_name_outweigh_the_users_estimate() -> None:
    """The README's demo after five `aisched run -- true`: the user's five 1-second jobs of
    another name are not similar to `big` (2 GPUs, `--estimate 30s`), however many there are,
    nor are jobs of her GPU count: its own estimate stands until five runs of `big` have
    finished, and then their history answers."""
    p = RuntimePredictor(PredictorConfig(min_similar=5))
    for i in range(5):
        p.observe(feats(f"t{i}", user="alice", name="true"), 0.1, finished_s=float(i))
    for i in range(5):
        p.observe(feats(f"o{i}", user="alice", gpus=2, name="other"), 2.0, finished_s=10.0 + i)
    big = replace(feats("big", user="alice", gpus=2, now=20.0, name="big"), estimate_s=30.0)
    got = p.predict(big)
    assert (got.median_s, got.upper_s, got.source) == (
        pytest.approx(30.0),
        pytest.approx(30.0),
        "own",
    )
    # Without its estimate, the thin history of her GPU count answers.
    assert p.predict(replace(big, job_id="b2", estimate_s=None)).source == "history:user-gpus"
    for i in range(4):
        p.observe(feats(f"big{i}", user="alice", gpus=2, name="big"), 40.0, finished_s=30.0 + i)
    assert p.predict(replace(big, job_id="b3", now_s=40.0)).source == "own"  # four: too few
    p.observe(feats("big4", user="alice", gpus=2, name="big"), 40.0, finished_s=40.0)
    got = p.predict(replace(big, job_id="b4", now_s=50.0))
    assert (got.median_s, got.source) == (pytest.approx(40.0), "history:name")


def test_a_prediction_before_a_seen_finish_is_refused() -> None:
    p = RuntimePredictor()
    p.observe(feats("a"), 100.0, finished_s=500.0)
    with pytest.raises(LeakageError, match="finished at t=500"):
        p.predict(feats("b", now=499.0))
    assert p.predict(feats("c", now=500.0)).median_s > 0


@pytest.mark.parametrize("runtime", [0.0, -1.0, math.inf, math.nan])
def test_a_runtime_that_is_not_positive_is_refused(runtime: float) -> None:
    with pytest.raises(ValueError, match="runtime_s must be positive"):
        RuntimePredictor().observe(feats("a"), runtime, 1.0)


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"upper_quantile": 0.5}, "upper_quantile"),
        ({"refit_every": 0}, "refit_every"),
        ({"prior_s": 0.0}, "prior_s"),
    ],
)
def test_bad_config_is_refused(kw: dict[str, float], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        PredictorConfig(**kw)  # type: ignore[arg-type]


def _feed(p: RuntimePredictor, n: int, *, fit: bool = True) -> float:
    """Two users: alice's 1-GPU jobs run ~100 s, bob's 8-GPU jobs ~10,000 s."""
    t = 0.0
    rng = np.random.default_rng(1)
    for i in range(n):
        t += 10.0
        alice = i % 2 == 0
        f = feats(f"j{i}", user="alice" if alice else "bob", gpus=1 if alice else 8, now=t)
        p.predict(f)
        base = 100.0 if alice else 10_000.0
        p.observe(f, base * float(rng.uniform(0.8, 1.25)), finished_s=t, fit=fit)
    return t


def test_the_model_learns_and_its_upper_bound_covers() -> None:
    p = RuntimePredictor(PredictorConfig(min_fit=200, refit_every=200, max_iter=30))
    t = _feed(p, 400)
    assert p.fitted and p.stats.fits == 2
    a = p.predict(feats("qa", user="alice", gpus=1, now=t))
    b = p.predict(feats("qb", user="bob", gpus=8, now=t))
    assert a.source == b.source == "model"
    assert 80 <= a.median_s <= 125 and 8000 <= b.median_s <= 12_500
    assert a.upper_s >= a.median_s and b.upper_s >= b.median_s


def test_same_calls_same_answers() -> None:
    answers = []
    for _ in range(2):
        p = RuntimePredictor(PredictorConfig(min_fit=200, refit_every=200, max_iter=20))
        t = _feed(p, 300)
        answers.append(p.predict(feats("q", user="bob", gpus=8, now=t)))
    assert answers[0] == answers[1]


def test_the_fast_tree_walk_matches_scikit_learn() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 4))
    x[rng.random(500) < 0.2, 1] = np.nan  # unknown values take the learned side
    y = 2 * x[:, 0] + np.nan_to_num(x[:, 1]) + rng.normal(size=500)
    model = QuantileModel.fit(x, y, 0.5, max_iter=20, max_depth=4, seed=0)
    assert model.fast
    slow = model._regressor.predict(x[:50])
    fast = np.array([model.predict_one(row) for row in x[:50]])
    np.testing.assert_allclose(fast, slow, atol=1e-9)


def test_a_column_without_information_is_left_out() -> None:
    x = np.column_stack([np.arange(100.0), np.full(100, np.nan), np.ones(100)])
    model = QuantileModel.fit(x, np.arange(100.0), 0.5, max_iter=10, max_depth=3, seed=0)
    assert 40 <= model.predict_one(np.array([50.0, np.nan, 1.0])) <= 60


def test_a_background_fit_leaves_the_caller_free_and_ends_with_the_same_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The service's predictor fits on a thread of its own: `observe` returns while the fit
    runs (here held until the test lets it go), predictions use the old answer meanwhile, and
    the finished fit is the one an in-line fit of the same examples gives."""
    import threading

    config = PredictorConfig(min_fit=200, refit_every=200, max_iter=20)
    inline = RuntimePredictor(config)
    t = _feed(inline, 200)
    want = inline.predict(feats("q", user="bob", gpus=8, now=t))
    assert want.source == "model"

    release, threads = threading.Event(), set()
    real_fit = QuantileModel.fit

    def held_fit(*args: object, **kw: object) -> QuantileModel:
        threads.add(threading.current_thread().name)
        assert release.wait(30), "the test never released the fit"
        return real_fit(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(QuantileModel, "fit", held_fit)
    bg = RuntimePredictor(config, background=True)
    _feed(bg, 200)  # the 200th observation starts the fit, which now waits for `release`
    assert bg.fitting and not bg.fitted
    meanwhile = bg.predict(feats("q", user="bob", gpus=8, now=t))
    assert meanwhile.source.startswith("history")
    release.set()
    assert bg.wait_for_fit(60)
    assert bg.fitted and threads == {"aisched-predictor-fit"}
    assert bg.predict(feats("q2", user="bob", gpus=8, now=t)) == inline.predict(
        feats("q2", user="bob", gpus=8, now=t)
    )


def test_a_backlog_learned_without_fitting_is_fitted_once_on_all_of_it() -> None:
    """The service's warm-up: `observe(fit=False)` only learns; `fit_if_due` then fits once,
    on every example, as a predictor that saw them all before its first fit would."""
    config = PredictorConfig(min_fit=100, refit_every=100, window=400, max_iter=20)
    backlog = RuntimePredictor(config)
    t = _feed(backlog, 400, fit=False)
    assert not backlog.fitted and backlog.stats.fits == 0
    q = feats("q", user="bob", gpus=8, now=t)
    assert backlog.predict(q).source.startswith("history")  # what a job gets meanwhile
    assert backlog.fit_if_due() and backlog.stats.fits == 1
    assert not backlog.fit_if_due()  # not due again until `refit_every` more finish
    # The same examples, with the first fit only once all of them were seen.
    at_once = RuntimePredictor(replace(config, min_fit=400))
    _feed(at_once, 400)
    assert at_once.stats.fits == 1
    q2 = feats("q2", user="bob", gpus=8, now=t)
    assert backlog.predict(q2) == at_once.predict(q2)
