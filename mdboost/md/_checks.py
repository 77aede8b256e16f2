"""Input validation for the mentored decoding core.

Every public entry point of :mod:`mdboost.md` validates its tensors here, so that bad input
(shape mismatch, NaN/inf, negative entries, rows not summing to one, budgets out of range,
token ids out of range) raises :class:`ValueError` with a message that names the argument and
the offending value. These checks synchronise with the device (they read back a boolean), so
the hot paths accept ``validate=False`` to skip them once inputs are known to be good.
"""

from __future__ import annotations

import torch

# Allowed |row sum - 1| per dtype: softmax rows of a 50k vocabulary in float32 sum to 1 only
# within ~1e-6, and half-precision rows within ~1e-3.
_SUM_TOL = {torch.float64: 1e-5, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def sum_tolerance(dtype: torch.dtype) -> float:
    """Tolerance on ``|sum(row) - 1|`` accepted for probability rows of ``dtype``."""
    return _SUM_TOL.get(dtype, 1e-3)


def check_probs(name: str, x, *, ndim: int | None = None, validate: bool = True) -> torch.Tensor:
    """Check that ``x`` is a floating tensor of probability rows over its last axis.

    Parameters
    ----------
    name : str
        Argument name used in error messages.
    x : torch.Tensor of shape (..., V)
        Candidate probabilities.
    ndim : int or None
        Required number of dimensions (None: at least one).
    validate : bool
        When False only the cheap structural checks run (no device synchronisation).
    """
    if not torch.is_tensor(x):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must have a floating dtype, got {x.dtype}")
    if x.ndim < 1 or (ndim is not None and x.ndim != ndim):
        want = f"{ndim} dimensions" if ndim is not None else "at least one dimension"
        raise ValueError(f"{name} must have {want}, got shape {tuple(x.shape)}")
    if x.shape[-1] < 1:
        raise ValueError(f"{name} must have a non-empty last (vocabulary) axis, got shape {tuple(x.shape)}")
    if not validate or x.numel() == 0:
        return x
    if not torch.isfinite(x).all():
        bad = x[~torch.isfinite(x)].flatten()[0].item()
        raise ValueError(f"{name} contains non-finite values (e.g. {bad})")
    if (x < 0).any():
        raise ValueError(f"{name} contains negative values (min {x.min().item():.3g})")
    sums = x.sum(dim=-1, dtype=torch.float64)
    err = (sums - 1.0).abs()
    tol = sum_tolerance(x.dtype)
    if (err > tol).any():
        worst = sums.flatten()[err.flatten().argmax()].item()
        raise ValueError(f"{name} rows must sum to 1 (tolerance {tol:g}); a row sums to {worst:.8g}")
    return x


def check_pair(draft_probs, target_probs, *, validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a drafter/target pair of the same shape; return both in a common float dtype."""
    p = check_probs("draft_probs", draft_probs, validate=validate)
    q = check_probs("target_probs", target_probs, validate=validate)
    if p.shape != q.shape:
        raise ValueError(
            f"draft_probs and target_probs must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}"
        )
    if p.device != q.device:
        raise ValueError(f"draft_probs and target_probs must be on one device, got {p.device} and {q.device}")
    dtype = torch.promote_types(p.dtype, q.dtype)
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    return p.to(dtype), q.to(dtype)


def check_budget(
    name: str,
    value,
    batch_shape: torch.Size | tuple,
    device: torch.device,
    *,
    upper: float | None = None,
    validate: bool = True,
) -> torch.Tensor:  # [*batch_shape] float64
    """Turn a scalar or tensor budget into a float64 tensor broadcast to ``batch_shape``.

    Budgets must be ``>= 0`` (and ``<= upper`` when given); ``+inf`` is allowed when ``upper``
    is None (an unlimited divergence budget). NaN is always an error.
    """
    try:
        t = torch.as_tensor(value, dtype=torch.float64, device=device)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name} must be a number or a tensor, got {value!r}") from exc
    try:
        t = torch.broadcast_to(t, tuple(batch_shape))
    except RuntimeError as exc:
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} does not broadcast to the batch shape {tuple(batch_shape)}"
        ) from exc
    if validate and t.numel():
        lo = t.min().item()
        hi = t.max().item()
        if torch.isnan(t).any():
            raise ValueError(f"{name} contains NaN")
        if lo < 0:
            raise ValueError(f"{name} must be >= 0, got {lo!r}")
        if upper is not None and hi > upper:
            raise ValueError(f"{name} must be <= {upper}, got {hi!r}")
    return t


def check_tokens(name: str, tokens, shape: tuple, vocab: int, *, validate: bool = True) -> torch.Tensor:
    """Check an integer token tensor of the given shape with ids in ``[0, vocab)``."""
    if not torch.is_tensor(tokens):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype, got {tokens.dtype}")
    if tuple(tokens.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(tokens.shape)}")
    if validate and tokens.numel():
        lo, hi = tokens.min().item(), tokens.max().item()
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} contains token id {bad} outside [0, {vocab})")
    return tokens.long()
