"""Label coding of multiclass self-normalized boosting (paper Section 4).

Definitions in ``docs/boosting.md`` ("Label coding"). Each example ``i`` has a set ``Y_i`` of
``n_i >= 1`` potential labels (potential next tokens) among ``n`` classes. Following Zhu et al.
(2009), it is coded as the vector

    y_ij = 1 / n_i          if j in Y_i,
    y_ij = -1 / (n - n_i)   otherwise,

so ``1^T y_i = 0`` and the label score ``y_i^T h`` of a hypothesis ``h(x_i) in R^n`` ignores any
constant shift of ``h`` (logits, log-probabilities). With one label ``j`` (``n_i = 1``) and
``S = sum_k h_k``: ``y_i^T h = h_j - (S - h_j) / (n - 1)``, which needs only the true label's
score and the score sum (what a logit cache keeps).

:class:`LabelSets` stores ``Y`` without ever building the dense ``[m, n]`` coding: as a column
index per example (1-D labels) or as the user's 0/1 indicator matrix (2-D labels).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LabelSets", "encode_labels", "label_scores", "label_scores_from_sums"]


def label_scores_from_sums(true_scores, score_sums, n_classes):
    """Label scores ``y_i^T h(x_i)`` of single labels from the true score and the score sum.

    Parameters
    ----------
    true_scores : array-like of shape (m,)
        ``h_j(x_i)`` for the label ``j`` of each example (e.g. the true token's logit).
    score_sums : array-like of shape (m,)
        ``S_i = sum_k h_k(x_i)`` over all ``n_classes`` classes (e.g. the logit sum).
    n_classes : int
        Number of classes ``n >= 2`` (the vocabulary size for an LLM).

    Returns
    -------
    ndarray of shape (m,)
        ``h_j - (S - h_j) / (n - 1)``.

    Examples
    --------
    >>> label_scores_from_sums([2.0], [3.0], 3)
    array([1.5])
    """
    if n_classes < 2:
        raise ValueError(f"n_classes must be >= 2, got {n_classes!r}")
    true_scores = np.asarray(true_scores, dtype=np.float64)
    score_sums = np.asarray(score_sums, dtype=np.float64)
    return true_scores - (score_sums - true_scores) / (n_classes - 1)


def label_scores(scores, labels):
    """Label scores ``y_i^T h(x_i)`` for a score matrix and labels given as indices or indicator.

    Parameters
    ----------
    scores : array-like of shape (m, n_classes)
        Hypothesis scores ``h(x_i)``, columns in ``classes_`` order.
    labels : array-like of shape (m,) or (m, n_classes)
        Column index of each example's label, or a 0/1 indicator of its potential labels.

    Returns
    -------
    ndarray of shape (m,)

    Examples
    --------
    >>> label_scores([[1.0, 0.0, 0.0]], [0])
    array([1.])
    >>> label_scores([[1.0, 1.0, 0.0]], [[1, 1, 0]])
    array([1.])
    """
    scores = np.asarray(scores, dtype=np.float64)  # [m, n]
    labels = np.asarray(labels)
    if labels.ndim == 1:
        sets = LabelSets(n_classes=scores.shape[1], index=labels.astype(np.intp))
    else:
        sets = LabelSets(n_classes=scores.shape[1], indicator=labels.astype(bool))
    return sets.scores(scores)


@dataclass(frozen=True)
class LabelSets:
    """Potential label sets ``Y_i`` of ``m`` examples over ``n_classes`` columns.

    Exactly one of ``index`` (1-D labels, ``n_i = 1``) and ``indicator`` is set.

    Parameters
    ----------
    n_classes : int
        Number of classes ``n``.
    index : ndarray of shape (m,), dtype intp, optional
        Column of each example's single label.
    indicator : ndarray of shape (m, n_classes), dtype bool, optional
        ``indicator[i, j]`` is True iff ``j in Y_i``.
    """

    n_classes: int
    index: np.ndarray | None = None
    indicator: np.ndarray | None = None

    @property
    def n_samples(self) -> int:
        """Number of examples ``m``."""
        return len(self.index) if self.index is not None else self.indicator.shape[0]

    @property
    def payload(self) -> np.ndarray:
        """What a pool member's ``label_scores(X, Y)`` receives: ``index`` or ``indicator``."""
        return self.index if self.index is not None else self.indicator

    def sizes(self) -> np.ndarray:
        """``n_i`` per example, shape (m,)."""
        if self.index is not None:
            return np.ones(len(self.index))
        return self.indicator.sum(axis=1).astype(np.float64)

    def coding(self) -> np.ndarray:
        """The dense coding ``y`` of shape (m, n_classes); O(m n) memory, meant for checks."""
        member = np.zeros((self.n_samples, self.n_classes), dtype=bool)
        if self.index is not None:
            member[np.arange(self.n_samples), self.index] = True
        else:
            member = self.indicator
        n_i = self.sizes()[:, None]
        return np.where(member, 1.0 / n_i, -1.0 / (self.n_classes - n_i))

    def scores(self, h) -> np.ndarray:
        """``y_i^T h(x_i)`` for scores ``h`` of shape (m, n_classes), returns shape (m,)."""
        h = np.asarray(h, dtype=np.float64)  # [m, n]
        total = h.sum(axis=1)
        if self.index is not None:
            true = h[np.arange(h.shape[0]), self.index]
            return label_scores_from_sums(true, total, self.n_classes)
        n_i = self.sizes()
        inside = np.einsum("ij,ij->i", h, self.indicator.astype(np.float64))
        return inside / n_i - (total - inside) / (self.n_classes - n_i)

    def contains(self, columns) -> np.ndarray:
        """Whether each predicted column lies in ``Y_i``, shape (m,) bool."""
        columns = np.asarray(columns)
        if self.index is not None:
            return columns == self.index
        return self.indicator[np.arange(self.n_samples), columns]

    def expand(self):
        """Single-label rows for fitting a weak learner on label sets.

        Returns
        -------
        rows : ndarray of shape (k,)
            Example of each expanded row (``k = sum_i n_i``).
        cols : ndarray of shape (k,)
            Its label column.
        share : ndarray of shape (k,)
            ``1 / n_i``: multiply the example's weight by it.
        """
        if self.index is not None:
            rows = np.arange(self.n_samples)
            return rows, self.index, np.ones(self.n_samples)
        rows, cols = np.nonzero(self.indicator)
        return rows, cols, 1.0 / self.sizes()[rows]


def _check_indicator(y) -> np.ndarray:
    values = np.unique(y)
    if not np.isin(values, [0, 1]).all():
        raise ValueError(f"y as a 2-D array must be a 0/1 indicator matrix, got values {values[:5]}")
    indicator = y.astype(bool)
    counts = indicator.sum(axis=1)
    bad = np.flatnonzero((counts == 0) | (counts == y.shape[1]))
    if bad.size:
        raise ValueError(
            f"y indicator rows need at least one 1 and one 0 (a potential label and a non-label); "
            f"row {bad[0]} has {counts[bad[0]]} ones out of {y.shape[1]} columns"
        )
    return indicator


def encode_labels(y, classes=None):
    """Turn validated targets into ``classes_`` and :class:`LabelSets`.

    Parameters
    ----------
    y : ndarray of shape (m,) or (m, n_columns)
        Class labels, or a 0/1 indicator of potential labels (column ``j`` is class ``j``).
    classes : ndarray of shape (n_classes,), optional
        Fixed class order (sorted); labels outside it raise. Default: ``np.unique(y)`` for
        1-D ``y`` and ``arange(n_columns)`` for an indicator.

    Returns
    -------
    classes : ndarray of shape (n_classes,)
    labels : LabelSets
    """
    y = np.asarray(y)
    if y.ndim == 2:
        indicator = _check_indicator(y)
        if classes is None:
            classes = np.arange(y.shape[1])
        if len(classes) != y.shape[1]:
            raise ValueError(f"y has {y.shape[1]} indicator columns, expected {len(classes)} classes")
        return classes, LabelSets(n_classes=len(classes), indicator=indicator)
    if classes is None:
        classes, index = np.unique(y, return_inverse=True)
    else:
        index = np.clip(np.searchsorted(classes, y), 0, len(classes) - 1)
        unknown = classes[index] != y
        if unknown.any():
            raise ValueError(f"y contains labels not in classes_: {y[unknown][:5]}")
    if len(classes) < 2:
        raise ValueError(f"y must hold at least 2 classes, got {len(classes)} class: {classes}")
    return classes, LabelSets(n_classes=len(classes), index=index.astype(np.intp).ravel())
