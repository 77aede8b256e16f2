"""Fixed scorers: the hypotheses of pool-mode boosting (paper Section 4: select from a pool).

In pool mode the hypotheses are fixed, already-trained scorers (fitted sklearn classifiers,
frozen LLMs over a logit cache). :class:`SelfNormalizedBoostClassifier` never clones or refits
them. A scorer (the :class:`FixedScorer` protocol) must expose

- ``classes_`` : ndarray of shape (n_classes,), sorted -- the class of each score column
  (an LLM: ``np.arange(vocab_size)``); all scorers of a pool must agree;
- ``decision_function(X) -> ndarray of shape (m, n_classes)`` -- real scores ``h(x_i)``
  (logits, log-probabilities, margins). Shape ``(m,)`` is accepted for 2 classes (sklearn's
  binary convention) and read as scores ``(-d/2, d/2)``.

and MAY expose

- ``n_rows`` : int -- the scorer reads ``X`` as row indices of shape (m, 1) into a table of
  ``n_rows`` rows (a logit cache). The estimator then checks ``X`` at its boundary (integral,
  finite, in ``[0, n_rows)``: :func:`check_row_indices`) and a bad index raises ValueError
  naming ``X`` before any scorer runs;
- ``label_scores(X, Y) -> ndarray of shape (m,)`` -- the label scores ``y_i^T h(x_i)``
  directly. ``Y`` is either an int array of shape (m,) holding each example's label as a
  column index into ``classes_``, or a bool indicator of shape (m, n_classes). For one label
  ``j``: ``y^T h = h_j - (S - h_j) / (n - 1)`` with ``S`` the score sum
  (:func:`mdboost.boosting.labels.label_scores_from_sums`), so an LLM scorer needs only the
  cached true-token logit and logit sum. When present the estimator uses it for edges and
  margins and never builds the ``[m, n_classes]`` score matrix there; ``decision_function`` is
  then only needed by ``predict``/``predict_proba``/``decision_function``.

``X`` is whatever the scorers accept after ``validate_data(dtype=None,
ensure_all_finite=False)``: any 2-D array, e.g. row indices into a logit cache of shape (m, 1).
:class:`TableScorer` is a reference scorer of that kind.

The pool-mode round lives here too: :func:`pool_label_scores` computes every scorer's label
scores once per fit, and :func:`pool_round` picks, under the current weights, the scorer of
largest ``|mu|`` (``docs/boosting.md``, "Pool mode and the ``FixedScorer`` protocol").
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import scipy.sparse as sp

from mdboost.boosting.labels import LabelSets, label_scores, label_scores_from_sums
from mdboost.boosting.margins import Step, edge_step, score_tolerance

__all__ = ["FixedScorer", "TableScorer", "check_pool", "check_pool_rows", "check_row_indices", "scores_of",
           "label_scores_of", "pool_label_scores", "pool_round"]


@runtime_checkable
class FixedScorer(Protocol):
    """A fixed scorer usable in pool mode (see the module docstring for the full contract)."""

    classes_: np.ndarray

    def decision_function(self, X) -> np.ndarray:  # [m, n_classes]
        """Real scores ``h(x_i)`` for each class of ``classes_``."""


def check_pool(pool) -> np.ndarray:
    """Validate a pool and return its shared ``classes_``."""
    if len(pool) == 0:
        raise ValueError("pool must hold at least one scorer, got an empty pool")
    classes = None
    for k, scorer in enumerate(pool):
        missing = [name for name, ok in (("decision_function(X)", callable(getattr(scorer, "decision_function", None))),
                                         ("classes_", hasattr(scorer, "classes_"))) if not ok]
        if missing:
            raise ValueError(
                f"pool[{k}] ({type(scorer).__name__}) must expose decision_function(X) and classes_; "
                f"it lacks {' and '.join(missing)} (a fitted classifier, or a fixed scorer)"
            )
        mine = np.asarray(scorer.classes_)
        if mine.ndim != 1:
            raise ValueError(f"pool[{k}].classes_ must be 1-D, got shape {mine.shape}")
        if mine.size > 1 and not bool(np.all(mine[1:] > mine[:-1])):
            raise ValueError(f"pool[{k}].classes_ must be sorted and unique, got {mine[:8]}")
        if classes is None:
            classes = mine
        elif mine.shape != classes.shape or not np.array_equal(mine, classes):
            raise ValueError(f"pool[{k}].classes_ differs from pool[0].classes_")
    if len(classes) < 2:
        raise ValueError(f"pool scorers must score at least 2 classes, got classes_={classes}")
    return classes


def check_row_indices(X, n_rows: int) -> np.ndarray:
    """Row indices ``X`` of shape (m, 1) into ``n_rows`` rows, as an int array of shape (m,).

    Raises ValueError naming ``X`` for another shape, a non-numeric, NaN, infinite or
    non-integral entry, or an index outside ``[0, n_rows)``.

    Examples
    --------
    >>> check_row_indices(np.array([[0], [2]]), 3)
    array([0, 2])
    """
    rows = np.asarray(X)
    if rows.ndim != 2 or rows.shape[1] != 1:
        raise ValueError(f"X must be row indices of shape (m, 1), got shape {rows.shape}")
    rows = rows[:, 0]
    if rows.dtype.kind not in "iub":
        try:
            values = rows.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"X must hold integer row indices, got dtype {rows.dtype}") from exc
        bad = ~np.isfinite(values) | (values != np.round(values))
        if bad.any():
            raise ValueError(f"X must hold integer row indices, got {values[bad][0]!r}")
        rows = values
    if rows.size and (rows.min() < 0 or rows.max() >= n_rows):
        bad = rows.min() if rows.min() < 0 else rows.max()
        raise ValueError(f"X holds row index {bad:g} outside [0, {n_rows})")
    return rows.astype(np.intp)


def check_pool_rows(pool, X):
    """Row indices ``X`` checked once, against the smallest ``n_rows`` of the pool.

    Only when some scorer exposes ``n_rows`` and ``X`` is dense (:func:`check_row_indices`);
    ``X`` itself is returned unchanged.
    """
    sizes = [int(s.n_rows) for s in pool if getattr(s, "n_rows", None) is not None]
    if sizes and not sp.issparse(X):
        check_row_indices(X, min(sizes))
    return X


def _call(scorer, method: str, *args):
    """``scorer.method(*args)``; an IndexError (a row index outside the scorer's table) names X."""
    try:
        return getattr(scorer, method)(*args)
    except IndexError as exc:
        raise ValueError(f"X holds a row index that {type(scorer).__name__}.{method} cannot read: {exc}") from exc


def scores_of(scorer, X, n_classes: int) -> np.ndarray:
    """``scorer.decision_function(X)`` as a float array of shape (m, n_classes)."""
    scores = np.asarray(_call(scorer, "decision_function", X), dtype=np.float64)
    if scores.ndim == 1 and n_classes == 2:
        scores = np.column_stack([-scores / 2.0, scores / 2.0])
    if scores.ndim != 2 or scores.shape[1] != n_classes:
        raise ValueError(
            f"{type(scorer).__name__}.decision_function returned shape {scores.shape}, "
            f"expected (m, {n_classes})"
        )
    return scores


def label_scores_of(scorer, X, labels: LabelSets, with_scale: bool = False):
    """``y_i^T h(x_i)`` of a scorer, shape (m,): its ``label_scores`` if any, else from scores.

    ``with_scale``: return ``(g, scale)``, ``scale`` the largest ``|h|`` of the score matrix
    when one was built here, else None (the rounding scale of ``g``).
    """
    if callable(getattr(scorer, "label_scores", None)):
        g = np.asarray(_call(scorer, "label_scores", X, labels.payload), dtype=np.float64)
        if g.shape != (labels.n_samples,):
            raise ValueError(
                f"{type(scorer).__name__}.label_scores returned shape {g.shape}, "
                f"expected ({labels.n_samples},)"
            )
        return (g, None) if with_scale else g
    scores = scores_of(scorer, X, labels.n_classes)
    g = labels.scores(scores)
    return (g, float(np.abs(scores).max(initial=0.0))) if with_scale else g


def pool_label_scores(pool, X, labels: LabelSets) -> tuple[np.ndarray, float]:
    """The label scores of every scorer and the rounding tolerance of ``h*``, once per fit.

    Parameters
    ----------
    pool : sequence of fixed scorers
    X : array-like of shape (m, n_features)
        What the scorers read (e.g. row indices of shape (m, 1)).
    labels : LabelSets
        The training labels (column indices into the scorers' ``classes_``).

    Returns
    -------
    g : ndarray of shape (n_scorers, m)
        ``y_i^T h_k(x_i)`` of each scorer ``k`` (:func:`label_scores_of`).
    tol : float
        ``64 eps max(1, M)``, as in estimator mode, with ``M`` the largest score magnitude the
        pool shows (of the score matrices built here, and of the label scores).
    """
    pairs = [label_scores_of(s, X, labels, with_scale=True) for s in pool]
    g = np.stack([pair[0] for pair in pairs])  # [K, m]
    scale = max([float(np.abs(g).max(initial=0.0))] + [pair[1] for pair in pairs if pair[1] is not None])
    return g, score_tolerance(scale)


def pool_round(pool, g, tol: float, sample_weight) -> tuple:
    """One pool-mode round: the scorer of largest ``|mu|`` under ``sample_weight``, and its step.

    ``h*`` of each scorer is taken over the examples of positive weight; a scorer whose ``h*``
    is at most ``tol`` (constant over the classes: its label scores are rounding noise) has edge
    0. The first scorer of largest ``|mu|`` is picked (a negative edge is fine: ``alpha < 0``);
    if that edge is 0 the round is rejected.

    Parameters
    ----------
    pool : sequence of fixed scorers
    g : ndarray of shape (n_scorers, m)
        From :func:`pool_label_scores`.
    tol : float
        From :func:`pool_label_scores`.
    sample_weight : ndarray of shape (m,)
        The current weights ``w_t``.

    Returns
    -------
    scorer : object
        The picked member of ``pool`` (by reference).
    step : Step
        ``step.weights`` is None when the round is rejected.

    Examples
    --------
    >>> from mdboost.boosting.labels import encode_labels
    >>> pool = [TableScorer([[0.0, 1.0], [0.0, 1.0]]), TableScorer([[2.0, 0.0], [0.0, 1.0]])]
    >>> X, (_, labels) = np.array([[0], [1]]), encode_labels(np.array([0, 1]))
    >>> g, tol = pool_label_scores(pool, X, labels)
    >>> scorer, step = pool_round(pool, g, tol, np.array([0.5, 0.5]))
    >>> scorer is pool[1], round(step.edge, 6), np.round(step.weights, 4).tolist()  # 2/7, 5/7
    (True, 0.75, [0.2857, 0.7143])
    """
    support = sample_weight > 0
    h_star = np.abs(g[:, support]).max(axis=1)
    useful = h_star > tol  # a scorer constant over the classes has rounding noise as label scores
    edges = np.where(useful, (g @ sample_weight) / np.where(useful, h_star, 1.0), 0.0)
    k = int(np.argmax(np.abs(edges)))
    step = edge_step(g[k], sample_weight, tol=tol)
    if step.weights is not None and step.edge == 0.0:
        step = Step(None, 0.0, 0.0, step.normalizer, "no pool scorer has a nonzero edge")
    return pool[k], step


class TableScorer:
    """A fixed scorer over a precomputed score table; ``X`` holds row indices.

    The reference implementation of :class:`FixedScorer` for cache-backed scorers: ``label_scores``
    of single labels uses only the true label's score and the row's score sum.

    Parameters
    ----------
    table : array-like of shape (N, n_classes)
        Scores ``h`` of ``N`` cached rows (e.g. logits).
    classes : array-like of shape (n_classes,), optional
        Class of each column; default ``arange(n_classes)``.

    Examples
    --------
    >>> scorer = TableScorer([[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    >>> scorer.label_scores(np.array([[0], [1]]), np.array([0, 2]))
    array([1.5, 3. ])
    """

    def __init__(self, table, classes=None):
        self.table = np.asarray(table, dtype=np.float64)  # [N, n]
        self.classes_ = np.arange(self.table.shape[1]) if classes is None else np.asarray(classes)
        self.row_sums_ = self.table.sum(axis=1)  # [N]
        self.n_rows = self.table.shape[0]

    def _rows(self, X) -> np.ndarray:
        return check_row_indices(X, self.n_rows)

    def decision_function(self, X) -> np.ndarray:
        """Rows of the table, shape (m, n_classes)."""
        return self.table[self._rows(X)]

    def label_scores(self, X, Y) -> np.ndarray:
        """``y_i^T h(x_i)``, shape (m,), from the true score and the row sum for 1-D ``Y``."""
        rows = self._rows(X)
        Y = np.asarray(Y)
        if Y.ndim == 1:
            n = self.table.shape[1]
            return label_scores_from_sums(self.table[rows, Y], self.row_sums_[rows], n)
        return label_scores(self.table[rows], Y)
