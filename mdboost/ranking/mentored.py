"""The draft-start process on text sampled by mentored decoding itself (prompt lookup).

The acceptance rows are the target's continuations; at a point with a budget the engine emits
``pi`` instead, and for a drafter that reads the text (prompt lookup) that changes what it
proposes (``docs/ranking.md``, "The text is the target's"). :mod:`mdboost.cache.mentored`
samples the text MD emits at such a point; :func:`mentored_pair_rows` turns its rows file into
the :class:`~mdboost.ranking.pair.PairRows` the process runs on, and :func:`mentored_outcomes`
scores the point there.

On that text the emitted token at a drafted position is ``~ pi``, so the conditional acceptance
``c_t`` of :mod:`mdboost.ranking.process` has mean ``E_pi[c_t] = sum_i min(pi_i, p_i) = P_acc_t``
at every position: the chain needs no budget tilt (``tilt = None``), which exists only to
correct ``q``-sampled text.
"""

from __future__ import annotations

import dataclasses

import torch

from mdboost.ranking.acceptance import md_operating_points, sd_acceptance
from mdboost.ranking.layout import SequenceLayout
from mdboost.ranking.pair import PairRows
from mdboost.ranking.process import PointInputs, process_outcomes
from mdboost.ranking.support import MemberRows, align, rows_from_proposals

__all__ = ["mentored_outcomes", "mentored_pair_rows"]


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
