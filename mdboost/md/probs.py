"""Logits to distributions: the one place where both models' logits become probabilities.

Drafter and target go through the same function with the same settings, so that p and q are
comparable (``docs/theory.md``, "Notation"). Every valid input gives rows that sum to one
(``docs/theory.md``, section 9): ``+inf`` logits share the row's mass equally (the limit of the
softmax), and a temperature so small that ``logits / temperature`` overflows (or that rounds to 0
in the logits' dtype, e.g. 1e-300 for float32) gives the limit as well (the argmax tokens), instead of NaN.
"""

from __future__ import annotations

import torch

from mdboost.md._checks import check_positive_int, check_real, check_tensor


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
        Unnormalized log-probabilities. ``-inf`` entries are allowed (masked tokens), as long
        as every row keeps one entry above ``-inf`` (a row of ``-inf`` only is a ValueError at
        every temperature, greedy included); ``+inf`` entries take the row's whole mass
        (shared equally). NaN is an error.
    temperature : float, default=1.0
        Softmax temperature, finite and ``>= 0``. ``0`` means greedy: a one-hot distribution on
        the argmax (ties go to the lowest token id).
    top_k : int or None, default=None
        Keep only the ``top_k`` largest logits (``1 <= top_k``; values above V keep all).
    top_p : float or None, default=None
        Nucleus sampling: keep the smallest set of most likely tokens whose probability
        reaches ``top_p``, in ``(0, 1]``. Applied after temperature and ``top_k``.

    Returns
    -------
    torch.Tensor of shape (..., V)
        Probabilities in the dtype of ``logits`` (float32 for half inputs), rows summing to 1.
        Differentiable in ``logits`` (a plain softmax where no limit is taken).

    Examples
    --------
    >>> logits_to_probs(torch.tensor([0.0, float("inf"), float("inf")]))
    tensor([0.0000, 0.5000, 0.5000])
    """
    logits = check_tensor("logits", logits, detach=False)
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have a non-empty last (vocabulary) axis, got shape {tuple(logits.shape)}")
    temperature = check_real("temperature", temperature, low=0.0, high=float("inf"))
    if temperature == float("inf"):
        raise ValueError(f"temperature must be finite, got {temperature!r}")
    top_k = check_positive_int("top_k", top_k)
    top_p = check_real("top_p", top_p, low=0.0, high=1.0, low_open=True, allow_none=True)

    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if temperature == 0:
        _refuse_rows(logits)  # greedy reads every row: the same errors as the softmax's
        index = logits.argmax(dim=-1, keepdim=True)  # [..., 1]
        return torch.zeros_like(logits).scatter_(-1, index, 1.0)
    probs = _probs(logits / temperature, top_k, top_p)  # the division is a new tensor: the input is never changed
    if probs.numel() and torch.isnan(probs).any():  # one check of the output; the rare rows are redone
        _refuse_rows(logits)
        # +inf logits, or logits / temperature overflowing: the limit, from logits shifted by their row max
        top = logits.amax(-1, keepdim=True)
        shifted = torch.where(torch.isposinf(top), torch.where(torch.isposinf(logits), 0.0, -float("inf")),
                              logits - top)
        # the row's maxima stay 0: a temperature that rounds to 0 in the logits' dtype would make them 0 / 0
        probs = _probs(torch.where(shifted == 0, 0.0, shifted / temperature), top_k, top_p)
    return probs


def _refuse_rows(logits: torch.Tensor) -> None:  # [..., V]
    """ValueError for NaN logits and for a row whose entries are all ``-inf`` (no token has any
    probability: neither a softmax nor an argmax is defined), at every temperature."""
    if torch.isnan(logits).any():
        raise ValueError("logits contains NaN")
    dead = torch.isneginf(logits).all(-1)  # [...]
    if dead.any():
        row = tuple(dead.nonzero()[0].tolist())
        raise ValueError(f"logits has a row whose entries are all -inf (row {row}, {int(dead.sum())} such rows): "
                         f"no token has any probability")


def _probs(scores: torch.Tensor, top_k, top_p) -> torch.Tensor:  # [..., V] -> [..., V]
    vocab = scores.shape[-1]
    if top_k is not None and top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]  # [..., 1]
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
