"""Input validation for the mentored decoding core.

Every public entry point of :mod:`mdboost.md` validates its arguments here, so that bad input
(a wrong Python type, a meta or complex tensor, shape mismatch, NaN/inf, negative entries, rows
not summing to one, budgets out of range, token ids out of range) raises :class:`ValueError`
(:class:`TypeError` for a wrong Python type) with a message that names the argument and the
offending value, at the API boundary. The value checks synchronise with the device (they read
back a few numbers), so the hot paths accept ``validate=False`` to skip them once inputs are
known to be good; the structural checks (type, dtype, device, shape) always run and cost no
synchronisation. Inputs that require grad are read detached (``docs/theory.md``, section 9).
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np
import torch

from mdboost.md._router import host_ok, numpy_stats_ok

# Allowed |row sum - 1| per dtype: softmax rows of a 50k vocabulary in float32 sum to 1 only
# within ~1e-6, and half-precision rows within ~1e-3.
_SUM_TOL = {torch.float64: 1e-5, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}
HALF = (torch.float16, torch.bfloat16)


def sum_tolerance(dtype: torch.dtype) -> float:
    """Tolerance on ``|sum(row) - 1|`` accepted for probability rows of ``dtype``."""
    return _SUM_TOL.get(dtype, 1e-3)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the core computes in for inputs of ``dtype``: half precision goes to float32."""
    return torch.float32 if dtype in HALF else dtype


def check_tensor(name: str, x, *, floating: bool = True, ndim: int | None = None, detach: bool = True) -> torch.Tensor:
    """Structural checks of a tensor argument (no device synchronisation); returns it detached."""
    if not torch.is_tensor(x):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type == "meta":
        raise ValueError(f"{name} is a meta tensor (shape {tuple(x.shape)}, no data); give a tensor with values")
    if floating and not x.is_floating_point():
        raise ValueError(f"{name} must have a floating dtype, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    return x.detach() if detach and x.requires_grad else x


def check_probs(name: str, x, *, ndim: int | None = None, validate: bool = True, sums: bool = True) -> torch.Tensor:
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
    sums : bool
        Whether rows must sum to one (False: any non-negative finite values).

    Returns
    -------
    torch.Tensor
        ``x``, detached if it required grad.
    """
    x = _check_rows_structure(name, x, ndim)
    if validate and x.numel():
        _check_row_values(name, x, _row_stats(x).tolist(), sums)
    return x


def _check_rows_structure(name: str, x, ndim: int | None) -> torch.Tensor:
    x = check_tensor(name, x, ndim=ndim)
    if x.ndim < 1:
        raise ValueError(f"{name} must have at least one dimension, got shape {tuple(x.shape)}")
    if x.shape[-1] < 1:
        raise ValueError(f"{name} must have a non-empty last (vocabulary) axis, got shape {tuple(x.shape)}")
    return x


def _row_stats(x: torch.Tensor, row_sums: torch.Tensor | None = None):
    """``[min entry, min row sum, max row sum]`` as float64 [3] (one reduction pass over ``x``).

    ``row_sums``: the float64 row sums of ``x`` if the caller took them, else taken here.
    """
    if row_sums is None:
        row_sums = x.sum(dim=-1, dtype=torch.float64)  # a NaN or inf entry makes the sums non-finite
    return torch.stack([x.amin().double(), *torch.aminmax(row_sums)])


def _stats_np(a: np.ndarray, row_sums: np.ndarray) -> list:
    """:func:`_row_stats` of a CPU array and its float64 row sums in numpy, as floats (no torch op:
    a fraction of the cost; minima and maxima are exact, so the same values)."""
    return [float(np.minimum.reduce(a, axis=None)), float(np.minimum.reduce(row_sums, axis=None)),
            float(np.maximum.reduce(row_sums, axis=None))]


def _check_row_values(name, x, stats, sums: bool = True) -> None:
    """Raise for the read-back ``stats`` of :func:`_row_stats` (the messages of :func:`check_probs`)."""
    lo, low_sum, high_sum = stats
    if not (math.isfinite(low_sum) and math.isfinite(high_sum)):
        bad = x[~torch.isfinite(x)].flatten()
        value = bad[0].item() if bad.numel() else high_sum
        raise ValueError(f"{name} contains non-finite values (e.g. {value})")
    if lo < 0:
        raise ValueError(f"{name} contains negative values (min {lo:.3g})")
    tol = sum_tolerance(x.dtype)
    if sums and max(1.0 - low_sum, high_sum - 1.0) > tol:
        worst = low_sum if 1.0 - low_sum >= high_sum - 1.0 else high_sum
        raise ValueError(f"{name} rows must sum to 1 (tolerance {tol:g}); a row sums to {worst:.8g}")


def check_pair(draft_probs, target_probs, *, validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a drafter/target pair of the same shape; return both in the common compute dtype.

    With ``validate``, both rows' checks are read back in one device synchronisation.
    """
    return checked_pair(draft_probs, target_probs, validate=validate)[:2]


def checked_pair(draft_probs, target_probs, *, validate: bool = True, namespace=None):
    """:func:`check_pair`, and the float64 row sums ``(p, q)`` [..., 1] the check made, or None.

    The sums are ``x.sum(-1, keepdim=True, dtype=torch.float64)`` of the returned rows (those of
    the rescaling in :func:`mdboost.md._histogram.rows_of`, the same values), given only where
    the check summed in torch on rows the compute dtype leaves unchanged. ``namespace``: the
    statistics' namespace (:func:`mdboost.md._router.host_ok`; None: the rule).
    """
    p = _check_rows_structure("draft_probs", draft_probs, None)
    q = _check_rows_structure("target_probs", target_probs, None)
    sums = None
    if validate and p.numel() and q.numel() and numpy_stats_ok(p, namespace) and numpy_stats_ok(q, namespace):
        stats = [v for x in (p.numpy(), q.numpy())  # CPU: one numpy reduction pass each, no read-back
                 for v in _stats_np(x, np.add.reduce(x, axis=-1, dtype=np.float64))]
        _check_row_values("draft_probs", p, stats[:3])
        _check_row_values("target_probs", q, stats[3:])
    elif validate and p.device == q.device and p.numel() and q.numel() and p.shape == q.shape:
        sums = p.sum(-1, keepdim=True, dtype=torch.float64), q.sum(-1, keepdim=True, dtype=torch.float64)
        if host_ok(p, namespace) and host_ok(q, namespace):  # CPU: the minima and the sums' range in numpy, no torch op
            stats = [_stats_np(x.numpy(), s.numpy()) for x, s in ((p, sums[0]), (q, sums[1]))]
        else:
            stats = torch.cat([_row_stats(x, s) for x, s in ((p, sums[0]), (q, sums[1]))]).tolist()  # one read-back
            stats = [stats[:3], stats[3:]]
        _check_row_values("draft_probs", p, stats[0])
        _check_row_values("target_probs", q, stats[1])
    elif validate:
        check_probs("draft_probs", p)
        check_probs("target_probs", q)
    if p.shape != q.shape:
        raise ValueError(
            f"draft_probs and target_probs must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}"
        )
    if p.device != q.device:
        raise ValueError(f"draft_probs and target_probs must be on one device, got {p.device} and {q.device}")
    dtype = compute_dtype(torch.promote_types(p.dtype, q.dtype))
    if sums is not None and not (p.dtype == q.dtype == dtype):  # converted rows: their own sums
        sums = None
    return p.to(dtype), q.to(dtype), sums


def _as_real_tensor(name: str, value, device) -> torch.Tensor:
    """``value`` (a real number, a sequence of them or a real tensor) as a float64 tensor on ``device``."""
    if torch.is_tensor(value):
        if value.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor (no data)")
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must hold real numbers, got a tensor of dtype {value.dtype}")
        return value.detach().to(device=device, dtype=torch.float64)
    if isinstance(value, bool) or isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{name} must be a number or a tensor, got {value!r}")
    if isinstance(value, complex):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    try:
        return torch.as_tensor(value, dtype=torch.float64, device=device)
    except OverflowError as exc:  # a Python int beyond float64
        raise ValueError(f"{name} holds a number too large for float64 (use math.inf for no limit)") from exc
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{name} must be a number or a tensor, got {value!r}") from exc


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
    is None (an unlimited divergence budget). NaN is always an error. The values are checked
    as given, before broadcasting, so that a bad budget is reported even for an empty batch.
    """
    if is_number(value):  # a Python number: no tensor op
        if validate:
            _check_budget_range(name, float(value), float(value), upper)
        return torch.full(tuple(batch_shape), float(value), dtype=torch.float64, device=device)
    t = _as_real_tensor(name, value, device)
    try:
        out = torch.broadcast_to(t, tuple(batch_shape))
    except RuntimeError as exc:
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} does not broadcast to the batch shape {tuple(batch_shape)}"
        ) from exc
    if validate and t.numel():
        _check_budget_range(name, *torch.stack(torch.aminmax(t)).tolist(), upper)
    return out


def is_number(value) -> bool:
    """Whether ``value`` is a Python float, or an int that converts to one exactly (no tensor needed)."""
    return type(value) is float or (type(value) is int and abs(value) <= 1 << 53)


def _check_budget_range(name: str, lo: float, hi: float, upper: float | None) -> None:
    if math.isnan(lo) or math.isnan(hi):
        raise ValueError(f"{name} contains NaN")
    if lo < 0:
        raise ValueError(f"{name} must be >= 0, got {lo!r}")
    if upper is not None and hi > upper:
        raise ValueError(f"{name} must be <= {upper}, got {hi!r}")


def check_real(name: str, value, *, low: float, high: float, low_open: bool = False,
               allow_none: bool = False) -> float | None:
    """A real Python scalar in ``[low, high]`` (``(low, high]`` with ``low_open``), as a float."""
    if value is None and allow_none:
        return None
    if torch.is_tensor(value) and value.numel() == 1 and not value.is_complex() and value.device.type != "meta":
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number{' or None' if allow_none else ''}, got {value!r}")
    value = float(value)
    ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        span = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be in {span}, got {value!r}")
    return value


def check_positive_int(name: str, value, *, allow_none: bool = True) -> int | None:
    """A positive integer (an integral float such as ``4.0``, or a one-element tensor, is accepted), or None."""
    if value is None and allow_none:
        return None
    if torch.is_tensor(value) and value.numel() == 1 and not value.is_complex() and value.device.type != "meta":
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (Integral, Real)):
        raise TypeError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    if isinstance(value, Integral):
        number = int(value)
    elif math.isfinite(value) and float(value).is_integer():
        number = int(value)
    else:
        raise ValueError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    if number < 1:
        raise ValueError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return number


def check_tokens(name: str, tokens, shape: tuple, vocab: int, *, validate: bool = True) -> torch.Tensor:
    """Check an integer token tensor of the given shape with ids in ``[0, vocab)``."""
    tokens = check_tensor(name, tokens, floating=False)
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype, got {tokens.dtype}")
    if tuple(tokens.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(tokens.shape)}")
    if validate and tokens.numel():
        lo, hi = torch.stack(torch.aminmax(tokens)).tolist()
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} contains token id {bad} outside [0, {vocab})")
    return tokens.long()


def check_verify_inputs(draft_tokens, draft_probs, target_probs, *, validate: bool = True):
    """A verifier's three inputs checked, named as in its signature: ``draft_probs`` ``[B, K, V]``,
    ``target_probs`` ``[B, K + 1, V]`` and ``draft_tokens`` ``[B, K]`` in the vocabulary; returns
    ``(tokens, p, q_all)``."""
    p = check_probs("draft_probs", draft_probs, ndim=3, validate=validate)
    q_all = check_probs("target_probs", target_probs, ndim=3, validate=validate)
    batch, num_draft, vocab = p.shape
    if tuple(q_all.shape) != (batch, num_draft + 1, vocab):
        raise ValueError(
            f"target_probs must have shape ({batch}, {num_draft + 1}, {vocab}) to match draft_probs "
            f"{tuple(p.shape)}, got {tuple(q_all.shape)}"
        )
    return check_tokens("draft_tokens", draft_tokens, (batch, num_draft), vocab, validate=validate), p, q_all
