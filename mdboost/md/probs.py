"""Logits to distributions: the one place where both models' logits become probabilities.

Drafter and target go through the same function with the same settings, so that p and q are
comparable (``docs/theory.md``, "Notation").
"""

from __future__ import annotations

import torch


def logits_to_probs(
    logits: torch.Tensor,  # [..., V]
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:  # [..., V]
    """Turn logits into a probability distribution over the last axis.

    Parameters
    ----------
    logits : torch.Tensor of shape (..., V)
        Unnormalized log-probabilities. ``-inf`` entries are allowed (masked tokens).
    temperature : float, default=1.0
        Softmax temperature, ``>= 0``. ``0`` means greedy: a one-hot distribution on the
        argmax (ties go to the lowest token id).
    top_k : int or None, default=None
        Keep only the ``top_k`` largest logits (``1 <= top_k``; values above V keep all).
    top_p : float or None, default=None
        Nucleus sampling: keep the smallest set of most likely tokens whose probability
        reaches ``top_p``, in ``(0, 1]``. Applied after temperature and ``top_k``.

    Returns
    -------
    torch.Tensor of shape (..., V)
        Probabilities in the dtype of ``logits`` (float32 for half inputs), rows summing to 1.
    """
    if not torch.is_tensor(logits) or logits.ndim < 1:
        raise ValueError(f"logits must be a tensor with at least one dimension, got {type(logits).__name__}")
    if temperature is None or not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if top_k is not None and (int(top_k) != top_k or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
    if torch.isnan(logits).any():
        raise ValueError("logits contains NaN")

    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    vocab = logits.shape[-1]

    if temperature == 0:
        index = logits.argmax(dim=-1, keepdim=True)  # [..., 1]
        return torch.zeros_like(logits).scatter_(-1, index, 1.0)

    scores = logits / temperature  # [..., V] (a new tensor: the input is never changed)
    if top_k is not None and top_k < vocab:
        kth = torch.topk(scores, int(top_k), dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., V]
        drop_sorted = mass_before >= top_p  # the first token is always kept
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs
