"""How drafts are drawn: sampled or greedy, and llama.cpp's draft probability floor.

A rule's drafting (``docs/theory.md``, section 11) is ``"sampled"`` (``x ~ p``) or ``"greedy"``
(``x = argmax p``, the verifier seeing its one-hot: :func:`greedy_proposal`). Greedy drafting may
carry a **probability floor** ``p_min``: a step's drafting stops *before* the first position whose
draft confidence (:func:`draft_confidence`) is below ``p_min``, so that position and the ones
after it are not drafted (llama.cpp's ``--spec-draft-p-min``). The floor changes how many drafts a
step makes, never the law of a drafted position.
"""

from __future__ import annotations

import numbers

import torch

from mdboost.md.options import DRAFTING, FLOOR_TOP_K  # torch-free (a config checks them before torch loads)

__all__ = ["DRAFTING", "FLOOR_TOP_K", "check_draft_floor", "draft_confidence", "greedy_proposal"]


def greedy_proposal(draft_probs: torch.Tensor, draft_token: torch.Tensor | None = None) -> torch.Tensor:  # [..., V]
    """The one-hot of ``draft_token`` (default ``argmax p``, the lowest index among ties)."""
    if draft_token is None:
        draft_token = draft_probs.argmax(-1)
    return torch.zeros_like(draft_probs).scatter_(-1, draft_token.unsqueeze(-1), 1.0)


def draft_confidence(draft_logits: torch.Tensor) -> torch.Tensor:  # [..., V] -> [...]
    """llama.cpp's confidence in a greedy draft: the probability of the drafter's argmax under
    the softmax of its ``FLOOR_TOP_K`` largest logits at temperature 1.

    llama.cpp samples drafts through a chain of top-k 10 then ``dist`` (a softmax over what is
    left, no temperature: ``common/speculative.cpp:236-237``, ``common/sampling.cpp:355-399``),
    drafts the first candidate and stops where its probability is below ``p_min``
    (``common/speculative.cpp:363-371``; llama-cpp-python 0.3.36's vendored llama.cpp).

    Parameters
    ----------
    draft_logits : torch.Tensor of shape (..., V)
        The drafter's logits (the largest ``min(10, V)`` are enough: a cached top-k row works).

    Returns
    -------
    torch.Tensor of shape (...), in ``(0, 1]``, in ``draft_logits``' floating dtype (float32 at least).

    Examples
    --------
    >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    >>> [round(x, 4) for x in draft_confidence(logits).tolist()]
    [0.787, 0.3333]
    """
    if not torch.is_tensor(draft_logits) or draft_logits.ndim < 1 or draft_logits.shape[-1] < 1:
        raise ValueError(f"draft_logits must be a tensor [..., V] with V >= 1, got {draft_logits!r}")
    logits = draft_logits if draft_logits.dtype in (torch.float32, torch.float64) else draft_logits.float()
    top = logits.topk(min(FLOOR_TOP_K, logits.shape[-1]), dim=-1).values  # [..., k], largest first
    return torch.softmax(top, dim=-1)[..., 0]


def check_draft_floor(draft_p_min, drafting: str) -> float:
    """``draft_p_min`` as a float in ``[0, 1)``, and only with greedy drafting when it is above 0."""
    if isinstance(draft_p_min, bool) or not isinstance(draft_p_min, numbers.Real) or not 0 <= draft_p_min < 1:
        raise ValueError(f"draft_p_min must be a number in [0, 1), got {draft_p_min!r}")
    if draft_p_min > 0 and drafting != "greedy":
        raise ValueError(f"draft_p_min={draft_p_min!r} needs drafting='greedy' (a floor on the greedy draft's "
                         f"confidence), got drafting={drafting!r}")
    return float(draft_p_min)
