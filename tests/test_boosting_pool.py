"""Pool-mode boosting: fixed scorers, best-|edge| picks, the label_scores fast path."""

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression

from mdboost.boosting import LabelSets, TableScorer, SelfNormalizedBoostClassifier, encode_labels


class _Columns:
    """A pre-fitted sklearn classifier that sees only some feature columns."""

    def __init__(self, columns, X, y):
        self.columns = columns
        self.model = LogisticRegression(max_iter=500).fit(X[:, columns], y)
        self.classes_ = self.model.classes_

    def decision_function(self, X):
        return self.model.decision_function(np.asarray(X)[:, self.columns])


class _NoLabelScores:
    """The same table scorer without the label_scores fast path."""

    def __init__(self, table):
        self.inner = TableScorer(table)
        self.classes_ = self.inner.classes_

    def decision_function(self, X):
        return self.inner.decision_function(X)


class _NoDense(TableScorer):
    """Refuses to materialize [m, n_classes]: fitting and margins must use label_scores only."""

    def decision_function(self, X):
        raise AssertionError("decision_function must not be called")


def _tables(seed=0, N=200, n=50, k=3):
    rng = np.random.RandomState(seed)
    y = rng.randint(0, n, N)
    tables = []
    for strength in np.linspace(0.5, 2.0, k):
        t = rng.randn(N, n)
        t[np.arange(N), y] += strength * rng.rand(N) * 3
        tables.append(t)
    return np.arange(N)[:, None], y, tables


def _brute_force_edge(scores, y_coding, w):
    g = np.einsum("ij,ij->i", y_coding, scores)
    return (w @ g) / np.abs(g[w > 0]).max()


def test_pool_of_fitted_classifiers_picks_best_edge_first():
    X, y = make_classification(n_samples=300, n_features=8, n_informative=6, n_classes=3,
                               n_clusters_per_class=1, random_state=0)
    pool = [_Columns(cols, X, y) for cols in ([0], [1, 2], [3, 4, 5], list(range(8)))]
    clf = SelfNormalizedBoostClassifier(n_estimators=8, pool=pool).fit(X, y)
    _, labels = encode_labels(y)
    w = np.full(len(y), 1 / len(y))
    edges = [_brute_force_edge(m.decision_function(X), labels.coding(), w) for m in pool]
    best = int(np.argmax(np.abs(edges)))
    assert clf.estimators_[0] is pool[best]  # by reference: never cloned
    assert clf.edges_[0] == pytest.approx(edges[best])
    assert all(any(e is m for m in pool) for e in clf.estimators_)
    assert clf.score(X, y) >= pool[best].model.score(X[:, pool[best].columns], y) - 0.05
    np.testing.assert_array_equal(clf.classes_[clf.predict_proba(X).argmax(1)], clf.predict(X))


def test_label_scores_path_equals_dense_path_and_never_materializes():
    X, y, tables = _tables()
    fast = SelfNormalizedBoostClassifier(n_estimators=6, pool=[TableScorer(t) for t in tables])
    slow = SelfNormalizedBoostClassifier(n_estimators=6, pool=[_NoLabelScores(t) for t in tables])
    fast.fit(X, y)
    slow.fit(X, y)
    np.testing.assert_allclose(fast.edges_, slow.edges_, rtol=1e-10)
    np.testing.assert_allclose(fast.estimator_weights_, slow.estimator_weights_, rtol=1e-10)
    np.testing.assert_allclose(fast.predict_proba(X), slow.predict_proba(X), atol=1e-10)
    np.testing.assert_array_equal(fast.classes_, np.arange(50))  # from the scorers, not from y
    no_dense = SelfNormalizedBoostClassifier(n_estimators=6, pool=[_NoDense(t) for t in tables])
    history = list(no_dense._iter_fit(X, y))
    assert all(abs(w.sum() - 1) < 1e-12 and w.min() >= 0 for w in history)
    np.testing.assert_allclose(no_dense.edges_, fast.edges_)
    np.testing.assert_allclose(no_dense.margins(X, y), fast.margins(X, y), atol=1e-12)
    assert no_dense.margin_risk(X, y, 0.1) <= no_dense.margin_bound(0.1)


def test_adding_a_constant_to_scores_changes_nothing():
    X, y, tables = _tables(1)
    rng = np.random.RandomState(1)
    shifted = [t + rng.randn(t.shape[0], 1) * 50 + 7.0 for t in tables]
    a = SelfNormalizedBoostClassifier(n_estimators=6, pool=[TableScorer(t) for t in tables]).fit(X, y)
    b = SelfNormalizedBoostClassifier(n_estimators=6, pool=[TableScorer(t) for t in shifted]).fit(X, y)
    picks = lambda clf: [clf.pool.index(e) for e in clf.estimators_]  # noqa: E731
    assert picks(a) == picks(b)
    np.testing.assert_allclose(a.edges_, b.edges_, rtol=1e-9)
    np.testing.assert_allclose(a.estimator_weights_, b.estimator_weights_, rtol=1e-9)
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), atol=1e-9)
    np.testing.assert_allclose(a.margins(X, y), b.margins(X, y), atol=1e-9)


def test_negative_edge_scorer_gets_negative_alpha():
    X, y, tables = _tables(2, k=1)
    pos = SelfNormalizedBoostClassifier(n_estimators=3, pool=[TableScorer(tables[0])]).fit(X, y)
    neg = SelfNormalizedBoostClassifier(n_estimators=3, pool=[TableScorer(-tables[0])]).fit(X, y)
    assert pos.edges_[0] > 0 and neg.edges_[0] < 0
    np.testing.assert_allclose(neg.estimator_weights_, -pos.estimator_weights_)
    np.testing.assert_allclose(neg.predict_proba(X), pos.predict_proba(X), atol=1e-12)
    assert neg.margin_risk(X, y, 0.0) <= neg.margin_bound(0.0)


def test_pool_indicator_labels_and_stop_reasons():
    X, y, tables = _tables(3, n=8)
    ind = np.eye(8, dtype=int)[y]
    rows = np.arange(0, len(y), 3)
    ind[rows, (y[rows] + 1) % 8] = 1
    clf = SelfNormalizedBoostClassifier(n_estimators=5, pool=[TableScorer(t) for t in tables]).fit(X, ind)
    g = LabelSets(8, indicator=ind.astype(bool)).scores(clf.decision_function(X))
    np.testing.assert_allclose(clf.margins(X, ind, normalized=False), g, atol=1e-10)
    perfect = SelfNormalizedBoostClassifier(pool=[TableScorer(np.eye(8)[y] * 3.0)]).fit(X, y)
    assert perfect.stop_reason_.startswith("round 0: perfect") and len(perfect.estimators_) == 1
    assert perfect.score(X, y) == 1.0 and np.isfinite(perfect.estimator_weights_).all()
    useless = SelfNormalizedBoostClassifier(pool=[TableScorer(np.ones((len(y), 8)))]).fit(X, y)
    assert "useless" in useless.stop_reason_ and useless.estimators_ == []
    np.testing.assert_allclose(useless.predict_proba(X), 1 / 8)
    assert useless.margin_bound(0.0) == 1.0


def test_pool_validation():
    X, y, tables = _tables(4, k=2)
    scorer = TableScorer(tables[0])
    with pytest.raises(ValueError, match="pool"):
        SelfNormalizedBoostClassifier(pool=[]).fit(X, y)
    with pytest.raises(ValueError, match="estimator must be None"):
        from sklearn.tree import DecisionTreeClassifier
        SelfNormalizedBoostClassifier(DecisionTreeClassifier(), pool=[scorer]).fit(X, y)
    with pytest.raises(ValueError, match=r"pool\[1\]"):
        SelfNormalizedBoostClassifier(pool=[scorer, object()]).fit(X, y)
    with pytest.raises(ValueError, match=r"pool\[1\].classes_"):
        SelfNormalizedBoostClassifier(pool=[scorer, TableScorer(tables[1][:, :10])]).fit(X, y)
    with pytest.raises(ValueError, match="not in classes_"):
        SelfNormalizedBoostClassifier(pool=[scorer]).fit(X, y + 100)


def test_clone_keeps_pool_scorers_and_cross_validation_runs():
    from sklearn.base import clone
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    X, y = make_classification(n_samples=120, n_features=6, n_classes=3, n_informative=4, random_state=0)
    lr = LogisticRegression(max_iter=500).fit(X, y)  # a fitted sklearn classifier, used by reference
    table = TableScorer(np.random.RandomState(0).randn(120, 3))
    clf = SelfNormalizedBoostClassifier(n_estimators=3, pool=[lr])
    twin = clone(clf)
    assert twin.pool is not clf.pool and twin.pool[0] is lr
    assert clone(SelfNormalizedBoostClassifier(pool=(table,))).pool == (table,)
    assert clone(SelfNormalizedBoostClassifier(n_estimators=7)).get_params() == SelfNormalizedBoostClassifier(
        n_estimators=7).get_params()
    cv = StratifiedKFold(3)
    expected = [SelfNormalizedBoostClassifier(n_estimators=3, pool=[lr]).fit(X[tr], y[tr]).score(X[te], y[te])
                for tr, te in cv.split(X, y)]
    np.testing.assert_array_equal(cross_val_score(clf, X, y, cv=cv), expected)


def test_row_constant_scorer_is_dropped_not_leveraged_on_rounding_noise():
    rng = np.random.RandomState(0)
    for n_rows, n_classes, level in ((300, 3, 0.3), (200, 1000, 20.0)):
        y = rng.randint(0, n_classes, n_rows)
        good = rng.randn(n_rows, n_classes)
        good[np.arange(n_rows), y] += 2.0
        const = np.repeat(rng.rand(n_rows, 1) + level, n_classes, axis=1)  # scores constant over the classes
        rows = np.arange(n_rows)[:, None]
        assert 0 < np.abs(TableScorer(const).label_scores(rows, y)).max() < 1e-12  # rounding noise, not 0
        alone = SelfNormalizedBoostClassifier(n_estimators=5, pool=[TableScorer(const)]).fit(rows, y)
        assert alone.estimators_ == [] and "useless hypothesis" in alone.stop_reason_
        for scorer in (TableScorer(const), _NoLabelScores(const)):
            mixed = SelfNormalizedBoostClassifier(n_estimators=10, pool=[TableScorer(good), scorer]).fit(rows, y)
            ref = SelfNormalizedBoostClassifier(n_estimators=10, pool=[TableScorer(good)]).fit(rows, y)
            assert all(e is mixed.pool[0] for e in mixed.estimators_)
            np.testing.assert_array_equal(mixed.estimator_weights_, ref.estimator_weights_)


def test_failed_fit_leaves_no_half_fitted_state():
    from sklearn.exceptions import NotFittedError

    class _Broken(TableScorer):
        def label_scores(self, X, Y):
            raise RuntimeError("cache read failed")

    rows = np.arange(60)[:, None]
    y = np.arange(60) % 3
    clf = SelfNormalizedBoostClassifier(n_estimators=3, pool=[_Broken(np.ones((60, 3)))])
    with pytest.raises(RuntimeError):
        clf.fit(rows, y)
    with pytest.raises(NotFittedError):
        clf.predict(rows)
    good = TableScorer(np.random.RandomState(1).randn(60, 3))
    clf.set_params(pool=[good]).fit(rows, y)
    before = (clf.classes_.copy(), list(clf.estimators_), clf.predict_proba(rows))
    clf.set_params(pool=[_Broken(np.ones((60, 5)))])
    with pytest.raises(RuntimeError):
        clf.fit(rows, np.arange(60) % 5)
    np.testing.assert_array_equal(clf.classes_, before[0])  # the previous fit, whole
    assert clf.estimators_ == before[1]
    np.testing.assert_array_equal(clf.set_params(pool=[good]).predict_proba(rows), before[2])


def test_pool_classes_must_be_sorted():
    rows = np.arange(6)[:, None]
    with pytest.raises(ValueError, match=r"pool\[0\]\.classes_ must be sorted and unique"):
        SelfNormalizedBoostClassifier(pool=[TableScorer(np.ones((6, 3)), classes=[2, 0, 1])]).fit(rows, [0, 1, 2] * 2)
    with pytest.raises(ValueError, match=r"it lacks classes_"):
        SelfNormalizedBoostClassifier(pool=[LogisticRegression()]).fit(rows, [0, 1, 2] * 2)


def test_margins_read_y_as_fit_does_and_name_bad_arguments():
    X, y = make_classification(n_samples=80, n_features=5, n_classes=3, n_informative=3, random_state=1)
    clf = SelfNormalizedBoostClassifier(n_estimators=5, random_state=0).fit(X, y)
    with pytest.warns(Warning):  # DataConversionWarning, as fit gives for a column y
        column = clf.margins(X, y[:, None])
    np.testing.assert_array_equal(column, clf.margins(X, y))
    with pytest.raises(ValueError, match=r"y must have one row per row of X \(80\)"):
        clf.margins(X, y[:10])
    with pytest.raises(ValueError, match="theta must lie in"):
        clf.margin_risk(X, y, 2.0)
    with pytest.raises(ValueError, match="Sample weights must contain at least one non-zero"):
        clf.score(X, y, sample_weight=np.zeros(80))
