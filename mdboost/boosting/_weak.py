"""Estimator mode of :class:`~mdboost.boosting.estimator.SelfNormalizedBoostClassifier`: the weak learner.

Step 1 of a round in estimator mode (``docs/boosting.md``, "The algorithm"; paper Section 4):
a fresh clone of the weak learner (default ``DecisionTreeClassifier(max_depth=1)``) is fitted on
the weighted sample, a label set ``Y_i`` expanded into one row per potential label with weight
``w_i / n_i``, and its hypothesis ``h_t(x) in R^n_classes`` is its ``predict_proba`` mapped to
``classes_``, that log-probability clipped at :data:`LOG_PROBA_FLOOR`, or the one-hot code of its
``predict``. The round's arithmetic is :func:`mdboost.boosting.margins.edge_step`. Private: the
estimator's parameters (``estimator``, ``hypothesis``, ``random_state``) are the interface.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import clone
from sklearn.tree import DecisionTreeClassifier
from sklearn.utils.validation import has_fit_parameter

from mdboost.boosting.labels import LabelSets
from mdboost.boosting.margins import Step, edge_step, score_tolerance

__all__ = ["LOG_PROBA_FLOOR", "check_weak_learner", "make_estimator", "weak_round", "weak_scores", "weak_template"]

LOG_PROBA_FLOOR = float(np.log(np.finfo(np.float64).eps))
"""``hypothesis="log_proba"`` clips ``log p`` from below at ``log(machine eps)`` (about -36.04),
as SAMME.R clipped probabilities at eps: a class the weak learner gives probability 0 (or never
saw in its weighted sample) scores this floor instead of ``-inf``."""


def check_weak_learner(base, hypothesis: str) -> None:
    """The weak learner takes weights and gives the scores ``hypothesis`` reads (as AdaBoost checks).

    Parameters
    ----------
    base : estimator
        The weak learner (not fitted).
    hypothesis : {"proba", "log_proba", "predict"}
        What each round reads from it: ``predict_proba`` unless ``"predict"``.

    Raises
    ------
    ValueError
        If ``base.fit`` takes no ``sample_weight``, or ``base`` has no ``predict_proba`` that
        ``hypothesis`` needs.
    """
    if not has_fit_parameter(base, "sample_weight"):
        raise ValueError(f"estimator {type(base).__name__} does not support sample_weight: boosting reweights "
                         f"the examples every round")
    if hypothesis != "predict" and not callable(getattr(base, "predict_proba", None)):
        raise ValueError(f"estimator {type(base).__name__} has no predict_proba, which hypothesis="
                         f"{hypothesis!r} reads: use hypothesis='predict' or a probabilistic classifier")


def weak_template(estimator, hypothesis: str) -> tuple:
    """The weak learner every round clones, and its seed keys.

    Parameters
    ----------
    estimator : estimator or None
        The ``estimator`` parameter; None means ``DecisionTreeClassifier(max_depth=1)``.
        Otherwise checked by :func:`check_weak_learner`.
    hypothesis : {"proba", "log_proba", "predict"}
        The ``hypothesis`` parameter.

    Returns
    -------
    template : tuple of (estimator, list of str)
        The weak learner and the sorted names of its ``*random_state`` parameters (nested ones
        included), which :func:`make_estimator` seeds.
    """
    base = DecisionTreeClassifier(max_depth=1) if estimator is None else estimator
    if estimator is not None:
        check_weak_learner(base, hypothesis)
    return base, sorted(k for k in base.get_params(deep=True) if k.endswith("random_state"))


def make_estimator(random_state, template):
    """A fresh clone of the template's weak learner, each seed key drawn from ``random_state``.

    Parameters
    ----------
    random_state : numpy.random.RandomState
        Draws one ``randint(2**31 - 1)`` per seed key (none when there is no key).
    template : tuple of (estimator, list of str)
        From :func:`weak_template`.

    Returns
    -------
    estimator : estimator
        Not fitted.
    """
    base, seed_keys = template
    estimator = clone(base)
    if seed_keys:
        estimator.set_params(**{k: random_state.randint(np.iinfo(np.int32).max) for k in seed_keys})
    return estimator


def weak_scores(estimator, X, n_classes: int, hypothesis: str) -> np.ndarray:
    """The hypothesis ``h(x)`` of a fitted weak learner, shape (m, n_classes).

    Parameters
    ----------
    estimator : fitted estimator
        Its ``classes_`` are column indices into the boosted classifier's ``classes_``.
    X : {array-like, sparse matrix} of shape (m, n_features)
    n_classes : int
        Number of classes of the boosted classifier.
    hypothesis : {"proba", "log_proba", "predict"}
        ``predict_proba`` (classes the learner never saw score 0), its log clipped at
        :data:`LOG_PROBA_FLOOR`, or the one-hot code of ``predict``.

    Returns
    -------
    ndarray of shape (m, n_classes)
    """
    if hypothesis == "predict":
        scores = np.zeros((X.shape[0], n_classes))
        scores[np.arange(X.shape[0]), np.asarray(estimator.predict(X), dtype=np.intp)] = 1.0
        return scores
    proba = np.asarray(estimator.predict_proba(X), dtype=np.float64)  # [m, n_seen]
    scores = np.zeros((proba.shape[0], n_classes))
    scores[:, np.asarray(estimator.classes_, dtype=np.intp)] = proba
    if hypothesis == "log_proba":
        with np.errstate(divide="ignore"):
            scores = np.maximum(np.log(scores), LOG_PROBA_FLOOR)
    return scores


def weak_round(template, X, labels: LabelSets, sample_weight, random_state, hypothesis: str) -> tuple:
    """One estimator-mode round: fit a weak learner under ``sample_weight`` and take its step.

    A label set ``Y_i`` is expanded into one row per potential label with weight ``w_i / n_i``.
    ``h*`` up to the rounding tolerance ``64 eps max(1, M)``, ``M`` the largest magnitude of the
    round's scores, counts as a useless hypothesis; a non-positive edge rejects the round.

    Parameters
    ----------
    template : tuple of (estimator, list of str)
        From :func:`weak_template`.
    X : {array-like, sparse matrix} of shape (m, n_features)
    labels : LabelSets
        The training labels (column indices into ``classes_``).
    sample_weight : ndarray of shape (m,)
        The current weights ``w_t``.
    random_state : numpy.random.RandomState
        Seeds the clone (:func:`make_estimator`).
    hypothesis : {"proba", "log_proba", "predict"}
        See :func:`weak_scores`.

    Returns
    -------
    estimator : fitted estimator
        The round's hypothesis.
    step : Step
        ``step.weights`` is None when the round is rejected.
    """
    estimator = make_estimator(random_state, template)
    rows, cols, share = labels.expand()
    X_fit = X if labels.index is not None else X[rows]
    estimator.fit(X_fit, cols, sample_weight=sample_weight[rows] * share)
    scores = weak_scores(estimator, X, labels.n_classes, hypothesis)
    tol = score_tolerance(np.abs(scores).max())
    step = edge_step(labels.scores(scores), sample_weight, tol=tol)
    if step.weights is not None and step.edge <= 0:
        step = Step(None, step.edge, 0.0, step.normalizer, f"non-positive edge {step.edge:.3g}")
    return estimator, step
