"""The draft-start process on text sampled by a lossy rule itself (prompt lookup).

The acceptance rows are the target's continuations; at a point with a budget the engine emits
``pi`` instead, and for a drafter that reads the text (prompt lookup) that changes what it
proposes (``docs/ranking.md``, "The text is the target's"). :mod:`mdboost.cache.mentored`
samples the text MD or SGLang's lossy threshold emits at such a point;
:func:`mentored_pair_rows` turns its rows file into the :class:`~mdboost.ranking.pair.PairRows`
the process runs on, :func:`mentored_outcomes` scores an MD point there and
:func:`threshold_outcomes` a threshold point.

On that text the emitted token at a drafted position is ``~ pi``, so the conditional acceptance
``c_t`` of :mod:`mdboost.ranking.process` has mean ``E_pi[c_t] = sum_i min(pi_i, p_i) = P_acc_t``
at every position (a one-hot draft ``x``: ``c_t = 1[x = g]``, ``P_acc_t = pi_x``): the chain
needs no budget tilt (``tilt = None``), which exists only to correct ``q``-sampled text.
"""

from __future__ import annotations

import dataclasses

import torch

from mdboost.ranking.acceptance import md_operating_points, sd_acceptance
from mdboost.ranking.layout import SequenceLayout
from mdboost.ranking.pair import PairRows
from mdboost.ranking.process import PointInputs, process_outcomes
from mdboost.ranking.rule_points import point_law, text_acceptance, threshold_tail_bounds
from mdboost.ranking.support import MemberRows, align, rows_from_proposals

__all__ = ["mentored_outcomes", "mentored_pair_rows", "threshold_outcomes"]


class _Drafts:
    """The stored proposals, as :meth:`SequenceLayout.proposals` reads them from a cache."""

    def __init__(self, proposals: torch.Tensor):
        self._proposals = proposals.long()

    def ngram_proposals(self, member: str) -> torch.Tensor:  # [M, width]
        return self._proposals


def mentored_pair_rows(tensors: dict, acceptance, temperature: float):
    """The pair's :class:`~mdboost.ranking.pair.PairRows` on one mentored rows file.

    Parameters
    ----------
    tensors : dict
        :func:`mdboost.cache.mentored.load_mentored`'s tensors.
    acceptance : PairRows
        The pair on its target-sampled rows: names, cost ratios and prefill costs are kept.
    temperature : float, > 0
        The file's temperature.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    off, starts = tensors["seq_offsets"].tolist(), tensors["starts"].tolist()
    labels = torch.cat([tensors["ids"][a + s:b] for a, b, s in zip(off[:-1], off[1:], starts)]).long()
    sequence = torch.cat([torch.full((b - a - s,), i, dtype=torch.long)
                          for i, (a, b, s) in enumerate(zip(off[:-1], off[1:], starts))])
    lse = tensors["lse"].double()
    logp = tensors["topk_logits"].double() / temperature - lse[:, None]  # [M, k]
    tail = (1 - logp.exp().sum(-1)).clamp_min(0.0)
    true_logp = tensors["true_logit"].double() / temperature - lse
    target = MemberRows(tensors["topk_ids"].long(), logp, tail, true_logp, torch.ones(len(labels), dtype=torch.bool))
    props = tensors["proposals"].long()
    draft = rows_from_proposals(props[:, 0], labels)
    name = acceptance.draft.name
    layout = SequenceLayout(sequence, _Drafts(props), name, torch.as_tensor(starts, dtype=torch.long))
    return PairRows(dataclasses.replace(acceptance.draft, rows=draft, hypothesis=None),
                    dataclasses.replace(acceptance.target, rows=target, hypothesis=None), labels.numpy(),
                    layout=layout)


def mentored_outcomes(rows, divergence: str, max_divergence: float, vocab_size: int, settings, step_law: bool):
    """The point's :class:`~mdboost.ranking.process.ProcessOutcomes` on its mentored text ``rows``
    (priced like any point's, :func:`~mdboost.ranking.process.price_process`).

    The point is solved again on those rows (``settings.mode``), and the process runs without a
    budget tilt (module docstring), with the pair's speed model as everywhere else.
    """
    aligned = align(rows.draft.rows, rows.target.rows, vocab_size, torch.as_tensor(rows.labels))
    valid = rows.draft.rows.valid
    sd = sd_acceptance(aligned, valid)
    op = md_operating_points(aligned, valid, [divergence], [max_divergence], settings.mode)[0]
    point = PointInputs(op.a, op.b, op.acceptance)
    return process_outcomes(rows, [point], settings.process, sd_acceptance=sd, step_law=step_law)


def threshold_outcomes(rows, point, vocab_size: int, settings, step_law: bool):
    """A lossy threshold point's :class:`~mdboost.ranking.process.ProcessOutcomes` on its own
    text ``rows``, and whether the top-k cache bounds it.

    The point's law is read again on those rows; its chain is the text's ``1[x = g]`` without a
    tilt (module docstring). Where :func:`~mdboost.ranking.rule_points.threshold_tail_bounds`
    finds drafts outside the target's kept ids, the outcomes hold two more inputs after the
    point, its acceptance at each end (as on the target's text, where the ranking widens the
    point's intervals to hold them); the chain, read off the text, is the same at both.
    """
    aligned = align(rows.draft.rows, rows.target.rows, vocab_size, torch.as_tensor(rows.labels))
    valid = rows.draft.rows.valid
    law = point_law(point, aligned, valid, point.divergence)
    zeros = torch.zeros(valid.numel(), dtype=torch.float64)
    inputs = PointInputs(zeros, zeros, law.acceptance, 0.0, None,
                         text_acceptance(law, aligned, valid, torch.as_tensor(rows.labels)))
    bounds = threshold_tail_bounds(point, law, aligned, valid, rows.target.rows)
    ends = [] if bounds is None else [dataclasses.replace(inputs, acceptance=p_acc) for p_acc, _ in bounds]
    outcomes = process_outcomes(rows, [inputs, *ends], settings.process, sd_acceptance=sd_acceptance(aligned, valid),
                                step_law=step_law)
    return outcomes, bounds is not None
