"""Multiclass self-normalized boosting as a scikit-learn classifier (paper Section 4).

The multiclass extension of Nock & Nielsen's (2007) self-normalized boosting of
``docs/theory.md``, "Multiclass self-normalized boosting": real-valued hypotheses
``h_t(x) in R^n``, the label coding of
:mod:`mdboost.boosting.labels`, edges ``mu_t``, leveraging coefficients ``alpha_t`` and the
self-normalized weight update of :mod:`mdboost.boosting.margins`. The combination
``H_T = sum_t alpha_t h_t`` gives ``predict_proba = softmax(H_T)``. Two modes:

- estimator mode: each round fits a clone of ``estimator`` (default: a depth-1 tree) on the
  weighted sample and uses its ``predict_proba`` (or clipped log-probabilities) as ``h_t``;
- pool mode: each round picks, among fixed pre-trained scorers (:mod:`mdboost.boosting.scorers`),
  the one with the largest ``|mu|`` under the current weights.

This module is the scikit-learn contract (parameters, validation, fitted attributes, prediction,
margins); a round's mechanics are estimator mode's :mod:`mdboost.boosting._weak` and pool mode's
:func:`~mdboost.boosting.scorers.pool_label_scores` and :func:`~mdboost.boosting.scorers.pool_round`.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context, clone
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.extmath import softmax
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    _check_sample_weight,
    check_is_fitted,
    column_or_1d,
    validate_data,
)

from mdboost.boosting._weak import LOG_PROBA_FLOOR, weak_round, weak_scores, weak_template
from mdboost.boosting.labels import encode_labels
from mdboost.boosting.margins import margin_bound, margin_risk, scaled_weights
from mdboost.boosting.scorers import (
    check_pool,
    check_pool_rows,
    label_scores_of,
    pool_label_scores,
    pool_round,
    scores_of,
)

__all__ = ["SelfNormalizedBoostClassifier", "LOG_PROBA_FLOOR"]


class SelfNormalizedBoostClassifier(ClassifierMixin, BaseEstimator):
    """Multiclass self-normalized boosting classifier.

    Each round ``t`` gets real scores ``h_t(x) in R^n_classes``, the label scores
    ``g_ti = y_i^T h_t(x_i)`` (coding ``y_ij = 1/n_i`` on the potential labels, ``-1/(n - n_i)``
    elsewhere), ``h*_t = max_i |g_ti|``, ``u_ti = g_ti / h*_t``, the edge
    ``mu_t = sum_i w_ti u_ti``, ``alpha_t = ln((1 + mu_t) / (1 - mu_t)) / (2 h*_t)`` and the
    weights ``w_(t+1),i = w_ti (1 - mu_t u_ti) / (1 - mu_t^2)`` (they sum to 1 unnormalized).
    ``h*_t`` is taken over the examples of positive weight, so a zero weight drops an example
    from the rounds. ``classes_`` still comes from all of ``y`` (as in scikit-learn's ensembles):
    a class whose examples all weigh 0 stays a class (the coding's ``n`` counts it), so that
    case differs from dropping its examples.

    Parameters
    ----------
    estimator : object, default=None
        Weak learner with ``fit(X, y, sample_weight)`` and ``predict_proba`` (``predict`` for
        ``hypothesis="predict"``, e.g. ``RidgeClassifier``), cloned each round. None means
        ``DecisionTreeClassifier(max_depth=1)``. Must be None in pool mode.
    n_estimators : int, default=50
        Maximum number of rounds, in ``[1, inf)``. Boosting stops earlier on a perfect
        (``|mu| = 1``, alpha capped via ``EDGE_EPS``) or useless (``h* = 0``, or ``mu <= 0`` in
        estimator mode) hypothesis; ``stop_reason_`` says which.
    pool : list of fixed scorers, default=None
        Pool mode: fixed pre-trained scorers (:class:`~mdboost.boosting.scorers.FixedScorer`),
        never cloned or refitted (:func:`sklearn.base.clone` of this estimator keeps the
        same scorers, so ``cross_val_score`` and ``GridSearchCV`` work); each round picks the
        scorer of largest ``|mu|`` (it may be picked again). A
        negative edge gives a negative ``alpha`` (the round uses ``-h``), which is fine. ``X``
        is validated with ``dtype=None, ensure_all_finite=False`` and handed to the scorers:
        any 2-D array they accept, e.g. row indices of shape (m, 1) into a logit cache. When
        scorers expose ``n_rows``, every method checks ``X`` as row indices first
        (:func:`~mdboost.boosting.scorers.check_row_indices`: a NaN or out-of-range index
        raises ValueError naming ``X``); an IndexError from a scorer is reported the same way.
    hypothesis : {"proba", "log_proba", "predict"}, default="proba"
        Estimator mode: ``h_t`` is the weak learner's ``predict_proba`` mapped to ``classes_``
        (unseen classes score 0), its log clipped at ``LOG_PROBA_FLOOR``, or the one-hot code
        of its ``predict`` (discrete hypotheses, as in SAMME). Ignored in pool mode, where
        scorers' ``decision_function`` / ``label_scores`` are used.
    random_state : int, RandomState instance or None, default=None
        Seeds the ``random_state`` of each weak learner clone.

    Attributes
    ----------
    estimators_ : list
        The hypotheses ``h_t`` (fitted clones, or pool scorers by reference).
    estimator_weights_ : ndarray of shape (T,)
        ``alpha_t``.
    edges_ : ndarray of shape (T,)
        ``mu_t``.
    normalizers_ : ndarray of shape (T,)
        ``h*_t``.
    stop_reason_ : str
        Why boosting stopped.
    boosting_advantage_ : float
        ``sum_t mu_t^2``.
    classes_ : ndarray of shape (n_classes,)
        Class labels; ``arange(n_columns)`` for an indicator ``y``; the scorers' ``classes_``
        in pool mode.
    n_features_in_ : int
        Number of features (columns of ``X``) seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when ``X`` has string feature names.

    See Also
    --------
    sklearn.ensemble.AdaBoostClassifier : SAMME boosting with discrete hypotheses.

    References
    ----------
    R. Nock, F. Nielsen, "A Real generalization of discrete AdaBoost", AIJ 2007.
    J. Zhu, H. Zou, S. Rosset, T. Hastie, "Multi-class AdaBoost", 2009.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from mdboost.boosting import SelfNormalizedBoostClassifier
    >>> X, y = load_iris(return_X_y=True)
    >>> clf = SelfNormalizedBoostClassifier(n_estimators=20, random_state=0).fit(X, y)
    >>> clf.score(X, y) > 0.9
    True
    >>> bool(clf.margin_risk(X, y, 0.0) <= clf.margin_bound(0.0))
    True
    >>> bool(abs(clf.predict_proba(X[:2]).sum(axis=1) - 1).max() < 1e-12)
    True
    """

    _parameter_constraints: dict = {
        "estimator": [HasMethods(["fit", "predict"]), None],  # predict_proba too unless hypothesis="predict" (fit)
        "n_estimators": [Interval(Integral, 1, None, closed="left")],
        "pool": [list, tuple, None],
        "hypothesis": [StrOptions({"proba", "log_proba", "predict"})],
        "random_state": ["random_state"],
    }

    def __init__(self, estimator=None, *, n_estimators=50, pool=None, hypothesis="proba", random_state=None):
        self.estimator = estimator
        self.n_estimators = n_estimators
        self.pool = pool
        self.hypothesis = hypothesis
        self.random_state = random_state

    def __sklearn_is_fitted__(self):
        """Fitted once a fit finished (``estimators_`` set): a fit that raised is not fitted."""
        return hasattr(self, "estimators_")

    def __sklearn_clone__(self):
        """:func:`sklearn.base.clone`: every parameter cloned as scikit-learn does, except
        ``pool``, whose scorers are fixed and kept by reference (a new list of the same objects):
        cloning would leave a fitted classifier unfitted and copy a whole logit table per fold."""
        params = self.get_params(deep=False)
        pool = params.pop("pool")
        params = {k: clone(v, safe=False) for k, v in params.items()}
        return type(self)(**params, pool=None if pool is None else type(pool)(pool))

    # ------------------------------------------------------------------ validation
    def _x_kwargs(self) -> dict:
        if self.pool is not None:
            return dict(dtype=None, ensure_all_finite=False, accept_sparse=True)
        return dict(dtype=None, accept_sparse=["csr", "csc"])

    def _check_X(self, X):
        return self._check_rows(validate_data(self, X, reset=False, **self._x_kwargs()))

    def _check_rows(self, X):
        """Pool mode: row indices ``X`` checked once, against the smallest ``n_rows`` of the pool."""
        return X if self.pool is None else check_pool_rows(self.pool, X)

    def _validate_training_data(self, X, y, sample_weight):
        if sp.issparse(y):
            y = y.toarray()
        X, y = validate_data(self, X, y, multi_output=True, **self._x_kwargs())
        X = self._check_rows(X)
        if y.ndim == 2 and y.shape[1] == 1:
            y = column_or_1d(y, warn=True)
        if self.pool is not None:  # labels are checked against the scorers' classes_
            if self.estimator is not None:
                raise ValueError(f"estimator must be None in pool mode, got {self.estimator!r}")
            classes, labels = encode_labels(y, classes=check_pool(self.pool))
        else:
            check_classification_targets(y)
            classes, labels = encode_labels(y)
        w = _check_sample_weight(sample_weight, X, dtype=np.float64, copy=True, ensure_non_negative=True)
        w = scaled_weights(w)
        return X, classes, labels, w / w.sum()

    # ------------------------------------------------------------------ fitting
    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y, sample_weight=None):
        """Build the boosted classifier from the training set (X, y).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training inputs (pool mode: whatever the scorers accept, e.g. row indices).
        y : array-like of shape (n_samples,) or (n_samples, n_classes)
            Class labels, or a 0/1 indicator of the potential labels of each example (every row
            needs at least one 1 and one 0); then ``classes_ = arange(n_classes)``.
        sample_weight : array-like of shape (n_samples,), default=None
            Initial weights ``w_1`` (normalized to sum 1); None means uniform.

        Returns
        -------
        self : object
            Fitted estimator.
        """
        for _ in self._iter_fit(X, y, sample_weight):
            pass
        return self

    def _iter_fit(self, X, y, sample_weight=None):
        """Debug hook: fit like :meth:`fit`, yielding a copy of ``w_(t+1)`` after each round.

        Parameters are not validated here (``fit`` does it); the fitted attributes are set once
        the generator is exhausted.
        """
        X, classes, labels, w = self._validate_training_data(X, y, sample_weight)
        random_state = check_random_state(self.random_state)
        pool_g = pool_label_scores(self.pool, X, labels) if self.pool is not None else None
        template = weak_template(self.estimator, self.hypothesis)
        hyps, steps = [], []
        stop_reason = f"n_estimators={self.n_estimators} rounds done"
        for iboost in range(self.n_estimators):
            hyp, step = self._boost(iboost, X, labels, w, random_state, pool_g, template)
            if step.weights is not None:
                hyps.append(hyp)
                steps.append(step)
                w = step.weights
            if step.stop_reason is not None:
                stop_reason = f"round {iboost}: {step.stop_reason}"
                break
            yield w.copy()
        # only now, all together: a fit that raises leaves no half-fitted state (a refit, the old one)
        self.classes_, self.stop_reason_ = classes, stop_reason
        self.estimators_ = hyps
        self.estimator_weights_ = np.array([s.alpha for s in steps], dtype=np.float64)
        self.edges_ = np.array([s.edge for s in steps], dtype=np.float64)
        self.normalizers_ = np.array([s.normalizer for s in steps], dtype=np.float64)
        self.boosting_advantage_ = float(np.sum(self.edges_**2))

    def _boost(self, iboost, X, labels, sample_weight, random_state, pool_g=None, template=None):
        """One round: returns ``(hypothesis, Step)``; ``Step.weights`` is None if rejected.

        Estimator mode fits a weak learner (:func:`~mdboost.boosting._weak.weak_round`: a label
        set ``Y_i`` is expanded into one row per potential label with weight ``w_i / n_i``); pool
        mode picks the best ``|edge|`` scorer (:func:`~mdboost.boosting.scorers.pool_round`) from
        the precomputed ``pool_g = (label scores [n_scorers, m], rounding tolerance)``
        (:func:`~mdboost.boosting.scorers.pool_label_scores`); ``template``: the weak learner and
        its seed keys (:func:`~mdboost.boosting._weak.weak_template`).
        """
        if pool_g is not None:
            g, tol = pool_g
            return pool_round(self.pool, g, tol, sample_weight)
        return weak_round(template, X, labels, sample_weight, random_state, self.hypothesis)

    def _scores(self, hyp, X):
        if self.pool is not None:
            return scores_of(hyp, X, len(self.classes_))
        return weak_scores(hyp, X, len(self.classes_), self.hypothesis)

    # ------------------------------------------------------------------ prediction
    def _staged_H(self, X, copy=True):
        """Yield ``H_t = sum_{s <= t} alpha_s h_s(X)``, shape (m, n_classes), after each round.

        ``copy=False`` yields the one accumulator, updated in place (for :meth:`_H`).
        """
        H = np.zeros((X.shape[0], len(self.classes_)))
        for hyp, alpha in zip(self.estimators_, self.estimator_weights_):
            H += alpha * self._scores(hyp, X)
            yield H.copy() if copy else H

    def _H(self, X):
        """``H_T``, the last of :meth:`_staged_H` (zeros for an empty ensemble)."""
        H = np.zeros((X.shape[0], len(self.classes_)))
        for H in self._staged_H(X, copy=False):
            pass
        return H

    def _decision(self, H):
        return H[:, 1] - H[:, 0] if len(self.classes_) == 2 else H

    def decision_function(self, X):
        """``H_T(x) = sum_t alpha_t h_t(x)``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes), or (n_samples,) for two classes where it is
        ``H_1 - H_0`` (the label score of class ``classes_[1]``).
        """
        check_is_fitted(self)
        return self._decision(self._H(self._check_X(X)))

    def staged_decision_function(self, X):
        """Yield :meth:`decision_function` after each round."""
        check_is_fitted(self)
        for H in self._staged_H(self._check_X(X)):
            yield self._decision(H)

    def predict_proba(self, X):
        """``softmax(H_T(x))``, shape (n_samples, n_classes)."""
        check_is_fitted(self)
        return softmax(self._H(self._check_X(X)))

    def staged_predict_proba(self, X):
        """Yield :meth:`predict_proba` after each round."""
        check_is_fitted(self)
        for H in self._staged_H(self._check_X(X)):
            yield softmax(H)

    def predict(self, X):
        """Class of largest ``H_T(x)`` (equal to the argmax of ``predict_proba``)."""
        check_is_fitted(self)
        return self.classes_[np.argmax(self._H(self._check_X(X)), axis=1)]

    def staged_predict(self, X):
        """Yield :meth:`predict` after each round."""
        check_is_fitted(self)
        for H in self._staged_H(self._check_X(X)):
            yield self.classes_[np.argmax(H, axis=1)]

    def _accuracy(self, pred, y, sample_weight):
        if sample_weight is not None:
            # scikit-learn's checks (shape, negative entries, an all-zero weight), not np.average's ZeroDivisionError
            sample_weight = _check_sample_weight(sample_weight, pred, dtype=np.float64, ensure_non_negative=True)
        if len(y) != len(pred):  # scikit-learn's message, naming both lengths
            raise ValueError(f"y must have one label per row of X: X has {len(pred)} rows, y has {len(y)}")
        if np.ndim(y) == 2 and np.shape(y)[1] > 1:
            _, labels = encode_labels(np.asarray(y), classes=self.classes_)
            hits = labels.contains(np.searchsorted(self.classes_, pred))
        else:
            y = np.asarray(y).ravel()
            kinds = {x.dtype.kind in "US" for x in (y, self.classes_) if x.dtype.kind in "USbiuf"}
            if len(kinds) > 1:  # as accuracy_score: strings against numbers would just score 0
                raise ValueError(f"y holds labels of another type ({y.dtype}) than classes_ ({self.classes_.dtype}): "
                                 f"{self.classes_[:5].tolist()}")
            hits = pred == y
        return float(np.average(hits, weights=sample_weight))

    def score(self, X, y, sample_weight=None):
        """Accuracy; for an indicator ``y``, the fraction of predictions among ``Y_i``."""
        return self._accuracy(self.predict(X), y, sample_weight)

    def staged_score(self, X, y, sample_weight=None):
        """Yield :meth:`score` after each round."""
        for pred in self.staged_predict(X):
            yield self._accuracy(pred, y, sample_weight)

    # ------------------------------------------------------------------ margins
    def margins(self, X, y, normalized=True):
        """Margins ``y_i^T H_T(x_i)`` (log of the geometric-mean probability ratio of good over
        bad classes); normalized by ``sum_t |alpha_t| h*_t`` into [-1, 1] on the training
        support (0 for an empty ensemble).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_classes)
        normalized : bool, default=True

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        check_is_fitted(self)
        X = self._check_X(X)
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:  # a column of labels, as fit reads it
            y = column_or_1d(y, warn=True)
        if y.shape[:1] != (X.shape[0],):
            raise ValueError(f"y must have one row per row of X ({X.shape[0]}), got shape {y.shape}")
        _, labels = encode_labels(y, classes=self.classes_)
        margin = np.zeros(labels.n_samples)
        for hyp, alpha in zip(self.estimators_, self.estimator_weights_):
            g = label_scores_of(hyp, X, labels) if self.pool is not None else labels.scores(self._scores(hyp, X))
            margin += alpha * g
        if not normalized:
            return margin
        scale = float(np.sum(np.abs(self.estimator_weights_) * self.normalizers_))
        return margin / scale if scale > 0 else np.zeros_like(margin)

    def margin_bound(self, theta):
        """Training bound ``prod_t sqrt((1 - |mu_t|)^(1 - theta) (1 + |mu_t|)^(1 + theta))`` on
        the (``sample_weight``-weighted) fraction of normalized margins ``<= theta`` in [-1, 1]."""
        check_is_fitted(self)
        return margin_bound(self.edges_, theta)

    def margin_risk(self, X, y, theta, sample_weight=None):
        """Weighted fraction of normalized margins ``<= theta``."""
        return margin_risk(self.margins(X, y), theta, sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = self.pool is None
        return tags
