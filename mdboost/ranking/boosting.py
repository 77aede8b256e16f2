"""Boosting complementarity of a drafter/target pair over cached logits (paper Section 4).

Pool members here are frozen LLMs (or the prompt-lookup drafter) read from the logit cache;
``X`` holds row indices into the cache (shape ``(m, 1)``) and the labels are the true next
tokens. Label scores need only two cached numbers per row: with ``S`` the full-vocabulary
logit sum, ``y^T h = h_j - (S - h_j) / (n - 1)``
(``docs/theory.md``, "Multiclass self-normalized boosting").

Two runs per pair:

- ``target_first``: the paper's ``T = 2`` setting, round 1 the target then round 2 the
  drafter (more rounds alternate), computed with the estimator's own round arithmetic
  (:func:`mdboost.boosting.margins.edge_step`). It gives ``mu_target`` (round 1 edge),
  ``mu_drafter`` (round 2 edge, under the weights the target left), the boosting advantage
  ``A = mu_target^2 + mu_drafter^2``, the coefficients ``c1, c2`` of the boosted distribution
  ``softmax(c1 h_q + c2 h_p)``, the normalized margins and the margin bound.
- ``greedy``: :class:`mdboost.boosting.SelfNormalizedBoostClassifier` in pool mode over
  ``[target, drafter]``, which picks the member of largest ``|edge|`` each round.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from mdboost.boosting.estimator import SelfNormalizedBoostClassifier
from mdboost.boosting.labels import label_scores_from_sums
from mdboost.boosting.margins import edge_step, margin_bound, margin_risk


class CachedLogitsHypothesis:
    """A frozen LLM as a pool member: scores ``h(x_i)`` are its cached logits of row ``x_i``.

    Parameters
    ----------
    true_ids : array [N]
        True next token of each cached row (the labels this member can score cheaply).
    true_logit : array [N]
        The cached logit of the true next token.
    logit_sum : array [N]
        The cached full-vocabulary logit sum ``S``.
    vocab_size : int
        ``n``; ``classes_ = arange(n)``.
    topk_ids, topk_logits : arrays [N, k], optional
        Kept entries; ``decision_function`` fills the other ``n - k`` entries with
        ``(S - sum(kept)) / (n - k)`` so that row sums stay exact (an approximation of the
        tail, exact with ``full_logits``).
    full_logits : array [N, n], optional
        Full logits when the cache kept them.
    name : str
        Member name (for reports).
    """

    def __init__(self, true_ids, true_logit, logit_sum, vocab_size, *, topk_ids=None, topk_logits=None,
                 full_logits=None, name="model"):
        self.true_ids = np.asarray(true_ids, dtype=np.int64)
        self.n_rows = len(self.true_ids)  # the estimator's pool mode checks row indices against it
        self.true_logit = np.asarray(true_logit, dtype=np.float64)
        self.logit_sum = np.asarray(logit_sum, dtype=np.float64)
        self.vocab_size = int(vocab_size)
        self.topk_ids = None if topk_ids is None else np.asarray(topk_ids, dtype=np.int64)
        self.topk_logits = None if topk_logits is None else np.asarray(topk_logits, dtype=np.float64)
        self.full_logits = None if full_logits is None else np.asarray(full_logits, dtype=np.float64)
        self.name = name
        self.classes_ = np.arange(self.vocab_size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @staticmethod
    def _rows(X) -> np.ndarray:
        rows = np.asarray(X)
        if rows.ndim != 2 or rows.shape[1] != 1:
            raise ValueError(f"X must be cache row indices of shape (m, 1), got shape {rows.shape}")
        return rows[:, 0].astype(np.intp)

    def label_scores(self, X, Y) -> np.ndarray:  # [m]
        """``y_i^T h(x_i)`` for single labels ``Y`` (must be the cached true tokens)."""
        rows, Y = self._rows(X), np.asarray(Y)
        if Y.ndim != 1:
            raise ValueError(f"Y must be 1-D token ids for a cached member, got shape {Y.shape}")
        if not np.array_equal(Y, self.true_ids[rows]):
            if self.full_logits is None:
                raise ValueError("Y must be the cached true next tokens of rows X (the cache keeps only their logits)")
            return label_scores_from_sums(self.full_logits[rows, Y], self.logit_sum[rows], self.vocab_size)
        return label_scores_from_sums(self.true_logit[rows], self.logit_sum[rows], self.vocab_size)

    def decision_function(self, X) -> np.ndarray:  # [m, n]
        """Logits of rows ``X`` (tail filled as documented in the class when not kept)."""
        rows = self._rows(X)
        if self.full_logits is not None:
            return self.full_logits[rows]
        if self.topk_ids is None:
            raise ValueError("decision_function needs topk_ids/topk_logits or full_logits")
        kept = self.topk_logits[rows]
        fill = (self.logit_sum[rows] - kept.sum(1)) / max(self.vocab_size - kept.shape[1], 1)
        out = np.repeat(fill[:, None], self.vocab_size, axis=1)
        np.put_along_axis(out, self.topk_ids[rows], kept, axis=1)
        return out


class ProposalHypothesis:
    """A deterministic drafter (prompt lookup) as a pool member: ``h = one-hot(proposal)``.

    Rows without a proposal score 0 everywhere (they carry no information).

    Parameters
    ----------
    proposals : array [N]
        Proposed token per row, ``-1`` for none.
    vocab_size : int
    """

    def __init__(self, proposals, vocab_size, name="ngram"):
        self.proposals = np.asarray(proposals, dtype=np.int64)
        self.n_rows = len(self.proposals)
        self.vocab_size = int(vocab_size)
        self.name = name
        self.classes_ = np.arange(self.vocab_size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def label_scores(self, X, Y) -> np.ndarray:  # [m]
        rows = CachedLogitsHypothesis._rows(X)
        prop = self.proposals[rows]
        hit = (prop == np.asarray(Y)).astype(np.float64)
        return label_scores_from_sums(hit, (prop >= 0).astype(np.float64), self.vocab_size)

    def decision_function(self, X) -> np.ndarray:  # [m, n]
        rows = CachedLogitsHypothesis._rows(X)
        prop = self.proposals[rows]
        out = np.zeros((len(rows), self.vocab_size))
        has = prop >= 0
        out[np.flatnonzero(has), prop[has]] = 1.0
        return out


@dataclass
class PairBoost:
    """Result of the target-first run (and the greedy one when asked)."""

    mu_target: float
    mu_drafter: float
    advantage: float
    c_target: float
    c_drafter: float
    edges: list[float]
    picks: list[str]
    margins: np.ndarray  # [m] normalized margins in [-1, 1]
    bound: dict[float, float]
    risk: dict[float, float]
    greedy: dict = field(default_factory=dict)


def boost_target_first(target, drafter, rows, labels, n_rounds: int = 2, thetas=(0.0,)) -> PairBoost:
    """Rounds alternate target, drafter, target, ... (``n_rounds = 2``: the paper's T = 2).

    Parameters
    ----------
    target, drafter : pool members with ``label_scores``
    rows : array [m] of cache row indices
    labels : array [m] of true next tokens
    n_rounds : int, >= 2
    thetas : margin thresholds in [-1, 1] for the bound and the empirical risk
    """
    if n_rounds < 2:
        raise ValueError(f"n_rounds must be >= 2, got {n_rounds!r}")
    X = np.asarray(rows).reshape(-1, 1)
    g = {"target": target.label_scores(X, labels), "drafter": drafter.label_scores(X, labels)}
    w = np.full(len(X), 1.0 / len(X))
    edges, picks, alphas, stars = [], [], [], []
    coef = {"target": 0.0, "drafter": 0.0}
    for t in range(n_rounds):
        who = "target" if t % 2 == 0 else "drafter"
        step = edge_step(g[who], w)
        edges.append(step.edge)
        picks.append(who)
        alphas.append(step.alpha)
        stars.append(step.normalizer)
        coef[who] += step.alpha
        if step.weights is not None:
            w = step.weights
    margin = coef["target"] * g["target"] + coef["drafter"] * g["drafter"]
    scale = float(np.sum(np.abs(alphas) * np.asarray(stars)))
    normalized = margin / scale if scale > 0 else np.zeros_like(margin)
    thetas = [float(t) for t in thetas]
    return PairBoost(
        mu_target=edges[0], mu_drafter=edges[1], advantage=edges[0] ** 2 + edges[1] ** 2,
        c_target=coef["target"], c_drafter=coef["drafter"], edges=edges, picks=picks,
        margins=normalized,
        bound={t: float(margin_bound(edges, t)) for t in thetas},
        risk={t: float(margin_risk(normalized, t)) for t in thetas},
    )


def boost_greedy(target, drafter, rows, labels, n_estimators: int = 2) -> dict:
    """:class:`SelfNormalizedBoostClassifier` in pool mode over ``[target, drafter]``."""
    X = np.asarray(rows).reshape(-1, 1)
    clf = SelfNormalizedBoostClassifier(n_estimators=n_estimators, pool=[target, drafter])
    with warnings.catch_warnings():  # token ids are classes, not a regression target
        warnings.filterwarnings("ignore", message="The number of unique classes", category=UserWarning)
        clf.fit(X, labels)
    picks = ["target" if h is target else "drafter" for h in clf.estimators_]
    return {
        "greedy_first": picks[0] if picks else "",
        "greedy_picks": "+".join(picks),
        "greedy_advantage": float(clf.boosting_advantage_),
        "greedy_c_target": float(sum(a for a, p in zip(clf.estimator_weights_, picks) if p == "target")),
        "greedy_c_drafter": float(sum(a for a, p in zip(clf.estimator_weights_, picks) if p == "drafter")),
        "greedy_margin_bound_0": float(clf.margin_bound(0.0)) if len(picks) else 1.0,
        "greedy_stop_reason": clf.stop_reason_,
    }
