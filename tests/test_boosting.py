"""Self-normalized boosting in estimator mode: label coding, the round's arithmetic, invariants."""

import pickle
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_iris, load_wine, make_classification

from mdboost.boosting import (
    EDGE_EPS,
    LabelSets,
    SelfNormalizedBoostClassifier,
    edge_step,
    encode_labels,
    label_scores,
    label_scores_from_sums,
    margin_bound,
)


def _data(seed=0, n_classes=3, n=120):
    return make_classification(n_samples=n, n_features=6, n_informative=4, n_classes=n_classes,
                               n_clusters_per_class=1, random_state=seed)


def _indicator(seed=0, m=40, n=6):
    rng = np.random.RandomState(seed)
    ind = rng.rand(m, n) < 0.3
    good = rng.randint(0, n, m)
    ind[np.arange(m), good] = True
    ind[np.arange(m), (good + 1 + rng.randint(0, n - 1, m)) % n] = False
    assert ind.any(1).all() and (~ind).any(1).all()
    return ind


# ---------------------------------------------------------------- label coding
@pytest.mark.parametrize("kind", ["index", "indicator"])
def test_label_scores_match_dense_coding(kind):
    rng = np.random.RandomState(1)
    m, n = 40, 6
    h = rng.randn(m, n)
    labels = (LabelSets(n, index=rng.randint(0, n, m)) if kind == "index"
              else LabelSets(n, indicator=_indicator(1, m, n)))
    y = labels.coding()
    np.testing.assert_allclose(y.sum(axis=1), 0.0, atol=1e-12)  # 1^T y = 0
    np.testing.assert_allclose((y > 0).sum(axis=1), labels.sizes())
    np.testing.assert_allclose(labels.scores(h), np.einsum("ij,ij->i", y, h), atol=1e-12)
    shift = rng.randn(m, 1) * 100  # a constant per row changes nothing
    np.testing.assert_allclose(labels.scores(h + shift), labels.scores(h), atol=1e-9)
    np.testing.assert_allclose(label_scores(h, labels.payload), labels.scores(h), atol=1e-12)


def test_label_scores_from_sums_is_true_minus_mean_of_others():
    h = np.array([[3.0, 1.0, -2.0, 0.5]])
    expected = 1.0 - np.mean([3.0, -2.0, 0.5])
    assert label_scores_from_sums(h[:, 1], h.sum(1), 4)[0] == pytest.approx(expected)


def test_indicator_rows_must_have_a_one_and_a_zero():
    with pytest.raises(ValueError, match="y indicator rows"):
        encode_labels(np.array([[1, 0, 0], [1, 1, 1]]))
    with pytest.raises(ValueError, match="y indicator rows"):
        encode_labels(np.array([[1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="0/1 indicator"):
        encode_labels(np.array([[2, 0, 0], [0, 1, 0]]))
    with pytest.raises(ValueError, match="y must hold at least 2 classes"):
        encode_labels(np.array([4, 4, 4]))


# ---------------------------------------------------------------- one round
def test_edge_step_matches_formulas():
    rng = np.random.RandomState(2)
    g = rng.randn(30)
    w = rng.rand(30)
    w[3] = 0.0
    w /= w.sum()
    g[3] = 100.0  # outside the support: must not set h*
    step = edge_step(g, w)
    h_star = np.abs(np.delete(g, 3)).max()
    u = g / h_star
    mu = w @ u
    assert step.normalizer == pytest.approx(h_star)
    assert step.edge == pytest.approx(mu)
    assert step.alpha == pytest.approx(np.log((1 + mu) / (1 - mu)) / (2 * h_star))
    expected = w * (1 - mu * u) / (1 - mu**2)
    expected[3] = 0.0
    np.testing.assert_allclose(step.weights, expected, atol=1e-15)
    assert step.weights.sum() == pytest.approx(1.0, abs=1e-12)
    assert step.weights.min() >= 0


def test_edge_step_perfect_and_useless():
    w = np.full(4, 0.25)
    perfect = edge_step(np.array([2.0, 2.0, 2.0, 2.0]), w)
    assert perfect.stop_reason.startswith("perfect")
    assert perfect.edge == 1 - EDGE_EPS and np.isfinite(perfect.alpha) and perfect.alpha > 0
    useless = edge_step(np.zeros(4), w)
    assert useless.weights is None and useless.stop_reason.startswith("useless")


# ---------------------------------------------------------------- estimator invariants
@pytest.mark.parametrize("hypothesis_kind", ["proba", "log_proba", "predict"])
@pytest.mark.parametrize("seed", [0, 1])
def test_weights_self_normalize_every_round(hypothesis_kind, seed):
    X, y = _data(seed, n_classes=4)
    sw = np.random.RandomState(seed).rand(len(y))
    clf = SelfNormalizedBoostClassifier(n_estimators=25, hypothesis=hypothesis_kind, random_state=0)
    history = list(clf._iter_fit(X, y, sw))  # documented debug hook
    assert len(history) == len(clf.estimators_) >= 5
    for w in history:
        assert abs(w.sum() - 1.0) < 1e-12
        assert w.min() >= 0.0
    refit = SelfNormalizedBoostClassifier(n_estimators=25, hypothesis=hypothesis_kind, random_state=0)
    np.testing.assert_allclose(refit.fit(X, y, sw).edges_, clf.edges_)
    np.testing.assert_allclose(clf.boosting_advantage_, np.sum(clf.edges_**2))
    np.testing.assert_allclose(
        clf.estimator_weights_,
        np.log((1 + clf.edges_) / (1 - clf.edges_)) / (2 * clf.normalizers_),
    )


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), n_classes=st.integers(2, 5), weighted=st.booleans(),
       thetas=st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=5),
       hypothesis_kind=st.sampled_from(["proba", "log_proba"]))
def test_margin_bound_holds_on_every_fit(seed, n_classes, weighted, thetas, hypothesis_kind):
    X, y = _data(seed, n_classes=n_classes, n=90)
    sw = np.random.RandomState(seed).rand(len(y)) if weighted else None
    clf = SelfNormalizedBoostClassifier(n_estimators=15, hypothesis=hypothesis_kind, random_state=seed)
    clf.fit(X, y, sw)
    rho = clf.margins(X, y)
    assert np.all(np.abs(rho) <= 1 + 1e-9)
    for theta in thetas + [0.0]:
        risk = clf.margin_risk(X, y, theta, sample_weight=sw)
        assert risk <= clf.margin_bound(theta) + 1e-12
        assert clf.margin_bound(theta) == pytest.approx(margin_bound(clf.edges_, theta))


def test_margins_are_label_scores_of_H():
    X, y = _data(3, n_classes=4)
    clf = SelfNormalizedBoostClassifier(n_estimators=10, random_state=0).fit(X, y)
    _, labels = encode_labels(y)
    H = clf.decision_function(X)
    np.testing.assert_allclose(clf.margins(X, y, normalized=False), labels.scores(H), atol=1e-10)
    scale = np.sum(clf.estimator_weights_ * clf.normalizers_)
    np.testing.assert_allclose(clf.margins(X, y), labels.scores(H) / scale, atol=1e-12)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_predict_is_argmax_proba_and_staged_end_at_final(n_classes):
    X, y = _data(4, n_classes=n_classes)
    clf = SelfNormalizedBoostClassifier(n_estimators=12, random_state=0).fit(X, y)
    proba = clf.predict_proba(X)
    np.testing.assert_array_equal(clf.classes_[proba.argmax(1)], clf.predict(X))
    np.testing.assert_allclose(proba.sum(1), 1.0)
    stages = {name: list(getattr(clf, f"staged_{name}")(X))
              for name in ["predict", "predict_proba", "decision_function"]}
    for name, staged in stages.items():
        assert len(staged) == len(clf.estimators_)
        np.testing.assert_allclose(staged[-1], getattr(clf, name)(X))
    scores = list(clf.staged_score(X, y))
    assert scores[-1] == clf.score(X, y)
    if n_classes == 2:
        assert clf.decision_function(X).shape == (len(y),)


def test_pickle_round_trip():
    X, y = load_iris(return_X_y=True)
    clf = SelfNormalizedBoostClassifier(n_estimators=10, random_state=0).fit(X, y)
    clone = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(clone.predict_proba(X), clf.predict_proba(X))
    np.testing.assert_array_equal(clone.edges_, clf.edges_)
    assert clone.stop_reason_ == clf.stop_reason_


@pytest.mark.parametrize("load", [load_iris, load_wine])
@pytest.mark.parametrize("hypothesis_kind", ["proba", "log_proba"])
def test_zero_sample_weight_equals_dropping(load, hypothesis_kind):
    X, y = load(return_X_y=True)
    drop = np.random.RandomState(0).rand(len(y)) < 0.2
    sw = np.where(drop, 0.0, 1.0)
    kw = dict(n_estimators=20, hypothesis=hypothesis_kind, random_state=0)
    weighted = SelfNormalizedBoostClassifier(**kw).fit(X, y, sample_weight=sw)
    dropped = SelfNormalizedBoostClassifier(**kw).fit(X[~drop], y[~drop])
    np.testing.assert_allclose(weighted.edges_, dropped.edges_, rtol=1e-8)
    np.testing.assert_allclose(weighted.predict_proba(X), dropped.predict_proba(X), atol=1e-8)


def test_indicator_labels():
    X, y = _data(5, n_classes=4)
    rng = np.random.RandomState(5)
    one_hot = np.eye(4, dtype=int)[y]
    # one-hot indicator == 1-D labels 0..3
    a = SelfNormalizedBoostClassifier(n_estimators=10, random_state=0).fit(X, one_hot)
    b = SelfNormalizedBoostClassifier(n_estimators=10, random_state=0).fit(X, y)
    np.testing.assert_array_equal(a.classes_, np.arange(4))
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), atol=1e-12)
    # a second potential label on some rows
    multi = one_hot.copy()
    extra = rng.rand(len(y)) < 0.4
    multi[extra, (y[extra] + 1) % 4] = 1
    clf = SelfNormalizedBoostClassifier(n_estimators=15, random_state=0)
    history = list(clf._iter_fit(X, multi))
    assert all(abs(w.sum() - 1) < 1e-12 and w.min() >= 0 for w in history)
    pred = clf.predict(X)
    hits = multi[np.arange(len(y)), pred].astype(bool)
    assert clf.score(X, multi) == pytest.approx(hits.mean())
    assert clf.score(X, multi) > 0.6
    _, labels = encode_labels(multi)
    np.testing.assert_allclose(clf.margins(X, multi, normalized=False),
                               np.einsum("ij,ij->i", labels.coding(), clf.decision_function(X)))
    assert clf.margin_risk(X, multi, 0.2) <= clf.margin_bound(0.2)
    with pytest.raises(ValueError, match="y indicator rows"):
        clf.fit(X, np.ones_like(multi))


def test_perfect_weak_learner_stops_with_finite_model():
    X = np.repeat(np.arange(3.0), 10)[:, None]
    y = np.repeat(np.arange(3), 10)
    clf = SelfNormalizedBoostClassifier(n_estimators=10, random_state=0).fit(X, np.where(y > 0, 1, 0))
    assert clf.stop_reason_.startswith("round 0: perfect")
    assert len(clf.estimators_) == 1 and np.isfinite(clf.estimator_weights_).all()
    assert np.isfinite(clf.decision_function(X)).all()
    assert clf.score(X, np.where(y > 0, 1, 0)) == 1.0


def test_bad_parameters_raise():
    X, y = _data(6)
    with pytest.raises(ValueError, match="n_estimators"):
        SelfNormalizedBoostClassifier(n_estimators=0).fit(X, y)
    with pytest.raises(ValueError, match="hypothesis"):
        SelfNormalizedBoostClassifier(hypothesis="logits").fit(X, y)
    with pytest.raises(ValueError, match="(?i)sample.weight"):
        SelfNormalizedBoostClassifier().fit(X, y, sample_weight=np.zeros(len(y)))
    with pytest.raises(ValueError, match="theta"):
        SelfNormalizedBoostClassifier(n_estimators=2).fit(X, y).margin_bound(1.5)
    clf = SelfNormalizedBoostClassifier(n_estimators=2).fit(X, y)
    for bad in ("0.1", ["0.1", "0.2"], True):  # numpy would read the strings as numbers
        message = f"^theta must be a real number or an array of them, got {re.escape(repr(bad))}$"
        with pytest.raises(TypeError, match=message):
            clf.margin_bound(bad)
        with pytest.raises(TypeError, match="^theta must be a real number or an array of them"):
            clf.margin_risk(X, y, bad)
    assert clf.margin_bound(0) == clf.margin_bound(0.0) == margin_bound(clf.edges_, np.float32(0.0))


def test_weak_learner_needs_weights_and_the_scores_its_hypothesis_reads():
    from sklearn.linear_model import RidgeClassifier
    from sklearn.neighbors import KNeighborsClassifier

    X, y = load_iris(return_X_y=True)
    ridge = SelfNormalizedBoostClassifier(RidgeClassifier(), n_estimators=5, hypothesis="predict").fit(X, y)
    assert ridge.score(X, y) > 0.5 and len(ridge.estimators_) >= 1
    with pytest.raises(ValueError, match="RidgeClassifier has no predict_proba"):
        SelfNormalizedBoostClassifier(RidgeClassifier(), n_estimators=5).fit(X, y)
    with pytest.raises(ValueError, match="KNeighborsClassifier does not support sample_weight"):
        SelfNormalizedBoostClassifier(KNeighborsClassifier(), n_estimators=5).fit(X, y)


def test_score_names_a_y_that_does_not_match_X():
    X, y = load_iris(return_X_y=True)
    clf = SelfNormalizedBoostClassifier(n_estimators=3, random_state=0).fit(X, y)
    for bad in (y[:10], np.eye(3)[y][:10]):
        with pytest.raises(ValueError, match=r"^y must have one label per row of X: X has 150 rows, y has 10$"):
            clf.score(X, bad)
        with pytest.raises(ValueError, match="y has 10"):
            next(clf.staged_score(X, bad))
    with pytest.raises(ValueError, match=r"y holds labels of another type \(<U21\) than classes_ \(int64\)"):
        clf.score(X, y.astype(str))  # was 0.0: strings never equal the integer classes


def test_huge_finite_weights_fit_as_their_ratios():
    """1e307 each overflowed the sum to inf, every normalised weight to 0, and the tree refused them."""
    X, y = load_iris(return_X_y=True)
    big = SelfNormalizedBoostClassifier(n_estimators=3, random_state=0).fit(X, y, sample_weight=np.full(150, 1e307))
    plain = SelfNormalizedBoostClassifier(n_estimators=3, random_state=0).fit(X, y)
    np.testing.assert_array_equal(big.predict_proba(X), plain.predict_proba(X))
    assert big.margin_risk(X, y, 0.5, sample_weight=np.full(150, 1e307)) == plain.margin_risk(X, y, 0.5)


@pytest.mark.parametrize("bad", [np.r_[-1.0, np.ones(149)], np.r_[np.inf, np.ones(149)], np.r_[np.nan, np.ones(149)]])
def test_margin_risk_refuses_negative_or_non_finite_weights(bad):
    X, y = load_iris(return_X_y=True)
    clf = SelfNormalizedBoostClassifier(n_estimators=3, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match=r"^sample_weight must be finite and >= 0"):
        clf.margin_risk(X, y, 0.5, sample_weight=bad)
