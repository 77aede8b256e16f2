"""The rows one drafter/target pair is scored on: :class:`PairSide` and :class:`PairRows`.

A pair's rows are a :class:`PairRows` of two :class:`PairSide` (one pool member as this pair sees
it: cached rows, boosting hypothesis and cost ratio relative to the pair's target), read from an
opened cache by :mod:`mdboost.ranking.rows` (or :mod:`mdboost.ranking.mentored`) and scored by
:func:`mdboost.ranking.rank.score_pair`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mdboost.ranking.layout import SequenceLayout
from mdboost.ranking.support import MemberRows

__all__ = ["PairRows", "PairSide"]


@dataclass(frozen=True, eq=False)
class PairSide:
    """One pool member as a pair's scoring sees it: cached rows, boosting hypothesis, cost ratio.

    ``cost_ratio``: this member's time per draft token over the pair's target's undrafted step
    (1 for the target); ``cost_samples``: its repeated measurements on the same scale, when known
    (the speedup intervals then carry their spread, :mod:`mdboost.ranking.uncertainty`);
    ``prefill_per_token``: as a drafter, its own prefill cost per prompt token on that scale (0
    for prompt lookup; ``docs/theory.md``, "Speed model for ranking").
    """

    name: str
    rows: MemberRows
    hypothesis: object
    cost_ratio: float
    cost_samples: tuple | None = None
    prefill_per_token: float = 0.0


@dataclass(frozen=True, eq=False)
class PairRows:
    """The rows one ordered pair is scored on.

    ``labels`` [N]: true next tokens; ``row_ids`` [N]: each position's cache row (the boosting
    hypotheses' ``X``; None: ``arange(N)``); ``layout``: the rows grouped by sequence
    (:func:`~mdboost.ranking.layout.sequence_layout`), which turns on the draft-start process
    when these are the acceptance rows.
    """

    draft: PairSide
    target: PairSide
    labels: np.ndarray
    row_ids: np.ndarray | None = None
    layout: SequenceLayout | None = None

    def __post_init__(self):
        labels = np.asarray(self.labels)
        object.__setattr__(self, "labels", labels)
        n = (self.draft.rows.valid.numel(), self.target.rows.valid.numel(), labels.shape[0])
        if len(set(n)) != 1:
            raise ValueError(f"draft rows, target rows and labels must cover the same positions, got {n}")
        sequence = None if self.layout is None else torch.as_tensor(self.layout.sequence)
        if sequence is not None and sequence.shape != labels.shape:
            raise ValueError(f"layout covers {sequence.numel()} rows, labels {labels.size}")

    @property
    def positions(self) -> np.ndarray:  # [N]
        return np.arange(len(self.labels)) if self.row_ids is None else np.asarray(self.row_ids)
