"""Rows of a logit cache grouped by sequence: the layout the draft-start process runs on.

A cache stores one row per text position, the rows of each sequence contiguous and in text
order. :func:`padded_index` and :func:`gather_rows` turn flat rows ``[M, ...]`` into padded
per-sequence tensors ``[B, L, ...]``; :class:`SequenceLayout` carries the rows' sequence ids
(and, for a prompt-lookup drafter, its full draft proposals) to
:func:`mdboost.ranking.process.score_process`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdboost.models.ngram import NgramDrafter
from mdboost.models.specs import parse_drafter


def padded_index(sequence) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index [B, L], lengths [B])`` putting rows ``[M]`` into per-sequence rows.

    ``sequence[r]`` is the sequence of row ``r``; a sequence's rows must be contiguous and in
    text order (as in :class:`mdboost.cache.LogitCache`). ``index[b, t]`` is the row of position
    ``t`` of the ``b``-th sequence, ``-1`` past its length.
    """
    seq = torch.as_tensor(sequence, dtype=torch.long)
    if seq.ndim != 1:
        raise ValueError(f"sequence must be 1-D [M], got shape {tuple(seq.shape)}")
    if seq.numel() == 0:
        return torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    _, counts = torch.unique_consecutive(seq, return_counts=True)
    if torch.unique(seq).numel() != counts.numel():
        raise ValueError("sequence must keep each sequence's rows contiguous, got interleaved sequence ids")
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]])
    pos = torch.arange(int(counts.max()))
    index = offsets[:, None] + pos[None, :]
    return torch.where(pos[None, :] < counts[:, None], index, torch.full_like(index, -1)), counts


def gather_rows(values: torch.Tensor, index: torch.Tensor, fill=0) -> torch.Tensor:  # [M, ...] -> [B, L, ...]
    """``values[index]`` with ``fill`` where ``index == -1``."""
    out = values[index.clamp_min(0)]
    mask = (index < 0).reshape(*index.shape, *([1] * (values.ndim - 1)))
    return torch.where(mask, torch.full_like(out, fill), out)


@dataclass
class SequenceLayout:
    """Which sequence each cached row belongs to, and a prompt-lookup drafter's full drafts.

    ``sequence`` [M]: the rows' sequence ids (contiguous, in text order). ``prompt_lengths``
    [B]: each sequence's prompt tokens, in the order of :func:`padded_index` (None: unknown; the
    speed model then leaves prefill out). ``cache`` and ``member`` let :meth:`proposals` read
    (or recompute) an ``ngram`` member's drafts.
    """

    sequence: torch.Tensor
    cache: object = None
    member: str | None = None
    prompt_lengths: torch.Tensor | None = None

    def proposals(self, width: int) -> torch.Tensor:  # [M, width]
        """The ``ngram`` member's ``width`` drafts per row (``-1`` = none).

        Read from the cache when it kept enough (``ngram_lookahead``), else recomputed on the
        cached sequences with the member's :class:`~mdboost.models.ngram.NgramDrafter` (checked
        against the cached prefix).
        """
        cached = self.cache.ngram_proposals(self.member).long()  # [M, J]
        if cached.shape[1] >= width:
            return cached[:, :width]
        kind, n = parse_drafter(self.member)
        if kind != "ngram":
            raise ValueError(f"member {self.member!r} is not an ngram drafter")
        drafter, rows = NgramDrafter(n), []
        for index in range(self.cache.num_sequences):
            ids, start = self.cache.sequence(index)
            for t in range(start, ids.numel()):
                draft = drafter.propose(ids[:t], width)
                rows.append(torch.cat([draft, draft.new_full((width - draft.numel(),), -1)]))
        out = torch.stack(rows) if rows else cached.new_zeros(0, width)
        if out.shape[0] != cached.shape[0] or not torch.equal(out[:, :cached.shape[1]], cached):
            raise ValueError(f"recomputed proposals of {self.member!r} disagree with the cache")
        return out


def sequence_layout(cache, member: str | None = None) -> SequenceLayout:
    """The :class:`SequenceLayout` of a :class:`~mdboost.cache.LogitCache` (``member``: the drafter)."""
    ngram = member is not None and cache.kind(member) == "ngram"
    seq = cache.row_sequence()
    present = torch.unique_consecutive(seq)  # the sequences with rows, in row order (padded_index's)
    return SequenceLayout(seq, cache if ngram else None, member if ngram else None,
                          cache.prompt_lengths()[present])
