"""Static batches of ``B`` sequences: what a batch of the engine's rows expects to pay (``docs/theory.md``,
"Batches").

The engine (:func:`mdboost.engine.generate`) runs ``B`` rows as one batch: every step drafts for
all rows and verifies all rows in one target forward of ``B`` rows, until the slowest row is done
(finished rows stay in the batch). So a batch of ``B`` random sequences expects

- ``E[max_b n_b]`` steps, ``n_b`` a row's number of steps (its own draft-start process,
  :func:`~mdboost.ranking.process.step_count_law`);
- per step, a verification of the batch's widest draft ``W = max_b K_b`` (``v(W, B)``) and
  ``max_b F_b`` drafter forwards (``c(B)`` each), each row's ``(K_b, F_b)`` drawn from its own
  steps (the steps' mixture, weighted by steps), the rows independent;
- plain decoding: ``E[max_b N_b]`` steps for rows of ``N_b`` new tokens; both feed the batch's
  longest prompt at the first step (``L_b`` a row's prompt tokens).

The rows of a batch are independent draws from the sequences' mixture (each bootstrap resample
reweights the sequences, :mod:`mdboost.ranking.uncertainty`), so every expected maximum is
``E[max of B] = sum_j (1 - F(j)^B)`` over the mixture's CDF ``F`` (:func:`expected_max`,
:func:`expected_max_of`). At ``B = 1`` each is the mixture's mean, and :func:`batch_totals`
is the sequences' pooled sums over their count: the single-sequence speed model.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def check_batch_size(batch_size) -> int:
    """``batch_size`` as an int, or a ``ValueError`` naming it (a positive integer, numpy's included)."""
    try:
        ok = not isinstance(batch_size, bool) and int(batch_size) == batch_size and batch_size >= 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    return int(batch_size)


def expected_max(cdf: torch.Tensor, batch_size: int) -> torch.Tensor:  # [..., J] -> [...]
    """``E[max of B i.i.d. draws]`` of a variable on ``0..J-1`` with CDF ``cdf[..., j] = P(X <= j)``.

    ``E[X] = sum_{j >= 0} P(X > j)`` and ``P(max <= j) = F(j)^B``.

    >>> float(expected_max(torch.tensor([0.5, 1.0], dtype=torch.float64), 2))  # two fair coins: P(max = 1) = 3/4
    0.75
    """
    b = check_batch_size(batch_size)
    return (1 - cdf.clamp(0, 1) ** b).sum(-1)


def expected_max_of(values: torch.Tensor, weights: torch.Tensor, batch_size: int) -> torch.Tensor:  # [n], [R, n] -> [R]
    """``E[max of B draws]`` of fixed per-sequence ``values`` [n], each draw a sequence with
    probability proportional to ``weights`` [R, n] (one mixture per resample).

    >>> float(expected_max_of(torch.tensor([1.0, 3.0]), torch.ones(1, 2), 2)[0])  # 1 w.p. 1/4, else 3
    2.5
    """
    b = check_batch_size(batch_size)
    order = torch.argsort(values)
    v = values.double()[order]  # [n] ascending
    w = weights.double()[:, order]
    cdf = w.cumsum(-1) / w.sum(-1, keepdim=True)  # [R, n]
    prev = torch.cat([torch.zeros_like(cdf[:, :1]), cdf[:, :-1]], dim=-1)
    return ((cdf.clamp(0, 1) ** b - prev.clamp(0, 1) ** b) * v).sum(-1)


class BatchTotals(NamedTuple):
    """One batch's expectations in the speed model's terms (:func:`batch_totals`), each ``[R, ...]``."""

    steps: torch.Tensor  # E[max_b N_b]
    steps_by_draft_len: torch.Tensor  # [..., G + 1]: steps x P(W = K)
    drafter_forwards: torch.Tensor  # steps x E[max_b F_b]
    solved: torch.Tensor  # steps x the mixture's solved positions per step


def _width_law(hist: torch.Tensor, batch_size: int) -> torch.Tensor:  # [..., K + 1] step mixture -> law of the max
    cdf = (hist.cumsum(-1) / hist.sum(-1, keepdim=True).clamp_min(1e-300)).clamp(0, 1) ** batch_size
    return torch.diff(cdf, dim=-1, prepend=torch.zeros_like(cdf[..., :1]))


def batch_totals(mix, steps, steps_by_draft_len, steps_by_forwards, solved, batch_size: int, step_law=None) -> BatchTotals:
    """A batch of ``batch_size`` rows: expected steps, draft widths, drafter forwards and solved positions.

    Parameters
    ----------
    mix : callable
        ``x [..., n, *rest] -> [R, ..., *rest]``: the weighted mean over the ``n`` sequences per
        resample (the mixture the batch's rows are drawn from).
    steps : tensor [..., n]
        Expected steps per sequence (``ProcessResult.steps``).
    steps_by_draft_len, steps_by_forwards : tensors [..., n, G + 1], [..., n, G + 2]
        Expected steps per draft length and per drafter forwards.
    solved : tensor [..., n]
        Expected solved positions per sequence.
    batch_size : int
    step_law : tensor [..., n, J], optional
        ``P(N = j)`` per sequence (:func:`~mdboost.ranking.process.step_count_law`); required when
        ``batch_size > 1``.
    """
    b = check_batch_size(batch_size)
    per_step = mix(steps)  # [R, ...]: the mixture's mean steps
    if b == 1:  # E[max of 1] is the mean: the single-sequence model, without the step law
        n_steps = per_step
    elif step_law is None:
        raise ValueError(f"step_law is required at batch_size={b}")
    else:
        n_steps = expected_max(mix(step_law.cumsum(-1)), b)
    denom = per_step.clamp_min(1e-300)
    width = _width_law(mix(steps_by_draft_len), b)  # [R, ..., G + 1]
    fwd = _width_law(mix(steps_by_forwards), b)
    mean_fwd = (fwd * torch.arange(fwd.shape[-1], dtype=fwd.dtype)).sum(-1)
    return BatchTotals(n_steps, n_steps[..., None] * width, n_steps * mean_fwd, n_steps * mix(solved) / denom)
