"""The engine's two extension points, in transformers' signatures: logits processors and stopping criteria.

:class:`~mdboost.engine.settings.GenerationSettings` may carry a ``logits_processor``
(``(input_ids [B, L], scores [B, V]) -> scores``, a ``transformers.LogitsProcessor``) and a
``stopping_criteria`` (``(input_ids [B, L], scores) -> BoolTensor [B]``, a
``transformers.StoppingCriteria``). Both see, in batch order, each row's tokens before the
position at hand (prompt, generated tokens, the drafts before it), left-padded with the pad
token to the longest row, as transformers' own batched generation left-pads its rows.

The processor runs on the drafter's and the target's logits alike, before
:func:`mdboost.logits_to_probs` (``docs/theory.md`` section 1: ``p`` and ``q`` must come from
the same transformation to be comparable); the clamp then sees the processed distributions.
Without either hook the engine never calls this module (its outputs are unchanged).
"""

from __future__ import annotations

import torch

from mdboost.engine.kv import left_pad


def context_ids(rows: list[list[int]], pad_id: int, device) -> torch.Tensor:  # -> [B, L]
    """Each row's tokens, left-padded with ``pad_id`` to the longest row."""
    return left_pad(rows, pad_id, device)[0]


def process_at(processor, base: torch.Tensor, tokens: torch.Tensor | None, j: int,
               logits: torch.Tensor) -> torch.Tensor:  # [B, L], [B, >= j], [B, V] -> [B, V] float32
    """``processor`` on the logits of the position after ``base`` and the first ``j`` drafts."""
    ids = base if j == 0 else torch.cat([base, tokens[:, :j]], dim=1)
    return processor(ids, logits.float())


def process_logits(processor, base: torch.Tensor, tokens: torch.Tensor | None,
                   logits: torch.Tensor) -> torch.Tensor:  # [B, L], [B, w] or None, [B, n <= w + 1, V]
    """``processor`` at each of the ``n`` scored positions (position ``j`` follows ``j`` drafts)."""
    return torch.stack([process_at(processor, base, tokens, j, logits[:, j]) for j in range(logits.shape[1])], dim=1)


def stop_lengths(criteria, contexts: list[list[int]], emitted: dict[int, list[int]], pad_id: int,
                 device) -> dict[int, int]:
    """Rows that stop this step: ``{row: tokens kept}``, cut after the first token ``criteria`` flags.

    ``contexts[b]``: row ``b``'s tokens before this step (every row, in batch order);
    ``emitted``: the tokens each row still generating emits this step.
    """
    cut: dict[int, int] = {}
    for i in range(max((len(t) for t in emitted.values()), default=0)):
        rows = [c + emitted.get(b, [])[: i + 1] for b, c in enumerate(contexts)]
        done = torch.as_tensor(criteria(context_ids(rows, pad_id, device), None)).reshape(-1).expand(len(rows)).tolist()
        for b, toks in emitted.items():
            if b not in cut and len(toks) > i and done[b]:
                cut[b] = i + 1
    return cut
