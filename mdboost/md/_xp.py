"""The array namespace of the exact primal search: torch tensors or numpy float64 views.

The in-segment refinement, the small-vocabulary bracket and ``D_f`` on a segment are written
once (:mod:`mdboost.md._search`, :mod:`mdboost.md._segment`) over a namespace ``xp``: the
``torch``/``numpy`` functions that take the same arguments in both libraries (:data:`SHARED`,
with numpy-style ``axis=``/``keepdims=`` keywords, which torch accepts) plus the few below whose
spellings differ.

Which namespace (:func:`namespace_for`, by the rule of :func:`mdboost.md._router.on_numpy`): numpy for CPU tensors without autograd,
torch otherwise (GPU, autograd; the public entry points read inputs that require grad detached,
``docs/theory.md`` section 9). These searches run a few rounds of tiny batched ops on arrays
of ``[N, <= 2V]`` or ``[N, ~30]`` elements, where the cost is per op, and a tiny numpy op costs
a fraction of a torch one on CPU. Measured (one thread, exact KL primal query, same algorithm in
both namespaces): torch / numpy time 1.9 at ``[1, 50]`` and ``[1, 1000]``, 1.5 at ``[32, 257]``
(``verify(top_k=256)``), 1.0 at ``[64, 49152]``. Conversions are zero-copy views.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from mdboost.md._router import on_numpy


# the functions spelled, and called, the same in torch and numpy
SHARED = ("where", "maximum", "minimum", "clip", "isfinite", "concatenate", "abs", "all", "any", "argmax", "argmin",
          "sum", "amax", "amin", "ones_like", "zeros_like", "broadcast_to", "nextafter")


class _Namespace:
    """A namespace class binds :data:`SHARED` from its library: ``class X(_Namespace, library=np)``."""

    def __init_subclass__(cls, library, **kwargs):
        super().__init_subclass__(**kwargs)
        for fn in SHARED:
            if fn not in cls.__dict__:  # a namespace may define a faster spelling of its own
                setattr(cls, fn, staticmethod(getattr(library, fn)))


def _number_aware(fn, bound: str):
    """``fn`` (``torch.maximum`` / ``torch.minimum``) taking a Python number on either side as
    numpy's ufunc takes it: ``clamp`` with that number as its ``bound`` (NaN propagates alike)."""

    def op(a, b):
        if isinstance(b, (int, float)):
            return torch.clamp(a, **{bound: b})
        if isinstance(a, (int, float)):
            return torch.clamp(b, **{bound: a})
        return fn(a, b)

    op.__name__ = fn.__name__
    return staticmethod(op)


class TorchOps(_Namespace, library=torch):
    """The namespace over torch tensors (any device)."""

    name = "torch"

    @staticmethod
    def asarray(t: torch.Tensor) -> torch.Tensor:
        return t

    @staticmethod
    def device(x: torch.Tensor):
        return x.device

    @staticmethod
    def stack2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``[a, b]`` stacked on a new leading axis."""
        return torch.stack([a, b])

    @staticmethod
    def to_torch(x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def constant(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """A float64 constant tensor on ``like``'s device."""
        return values.to(like.device, torch.float64)

    @staticmethod
    def arange(stop: int, like: torch.Tensor, step: int = 1) -> torch.Tensor:
        return torch.arange(0, stop, step, device=like.device)

    maximum = _number_aware(torch.maximum, "min")
    minimum = _number_aware(torch.minimum, "max")

    @staticmethod
    def take(arr: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """``arr[n, idx[n, ...]]`` for ``arr`` [N, L] and ``idx`` [N, ...]."""
        if idx.ndim == 2:
            return torch.gather(arr, 1, idx)
        return torch.gather(arr, 1, idx.reshape(idx.shape[0], -1)).reshape(idx.shape)

    @staticmethod
    def searchsorted(sorted_rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Row-wise left insertion points of ``x`` [N, Q] in ``sorted_rows`` [N, L]."""
        return torch.searchsorted(sorted_rows, x.contiguous())

    @staticmethod
    def cummax(x: torch.Tensor) -> torch.Tensor:  # along the last axis
        return torch.cummax(x, -1).values.contiguous()

    @staticmethod
    def sort(x: torch.Tensor) -> torch.Tensor:  # ascending along the last axis, stable
        return torch.sort(x, dim=-1, stable=True).values

    @staticmethod
    def flip(x: torch.Tensor) -> torch.Tensor:  # along the last axis
        return torch.flip(x, [-1])

    @staticmethod
    def g(div, z: torch.Tensor) -> torch.Tensor:
        """The standardized generator ``g(z)`` of ``div`` (docs/theory.md, section 1)."""
        return div.g(z)

    @staticmethod
    def errstate():
        return contextlib.nullcontext()  # torch does not warn on 1/0 or inf - inf


def _reducer(ufunc):
    """``ufunc.reduce`` with the wrappers' defaults (``axis=None``: over every axis): numpy's
    function wrappers cost a few times the work on the tiny arrays of the searches."""

    def reduce(x, axis=None, keepdims=False):
        return ufunc.reduce(x, axis=axis, keepdims=keepdims)

    return staticmethod(reduce)


class NumpyOps(_Namespace, library=np):
    """The namespace over numpy arrays (CPU views of float64 / int64 tensors)."""

    name = "numpy"

    @staticmethod
    def asarray(t: torch.Tensor) -> np.ndarray:
        return t.numpy()

    @staticmethod
    def device(x: np.ndarray):
        return None

    @staticmethod
    def stack2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``[a, b]`` stacked on a new leading axis (cheaper than ``np.stack`` for tiny arrays)."""
        out = np.empty((2,) + a.shape, dtype=np.result_type(a, b))
        out[0], out[1] = a, b
        return out

    @staticmethod
    def to_torch(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(x))

    @staticmethod
    def constant(values: torch.Tensor, like: np.ndarray) -> np.ndarray:
        return values.to(torch.float64).numpy()

    @staticmethod
    def arange(stop: int, like: np.ndarray, step: int = 1) -> np.ndarray:
        return np.arange(0, stop, step)

    @staticmethod
    def take(arr: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """``arr[n, idx[n, ...]]`` for a C-contiguous ``arr`` [N, L]: one flat take."""
        rows, width = arr.shape
        if rows == 1:
            return arr.take(idx)
        offsets = np.arange(0, rows * width, width).reshape((rows,) + (1,) * (idx.ndim - 1))
        return arr.take(idx + offsets)

    @staticmethod
    def searchsorted(sorted_rows: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Row-wise left insertion points: numpy for one row, else through torch (numpy has no batched one)."""
        if sorted_rows.shape[0] == 1:
            return np.searchsorted(sorted_rows[0], x)
        rows, x = np.ascontiguousarray(sorted_rows), np.ascontiguousarray(x)
        return torch.searchsorted(torch.from_numpy(rows), torch.from_numpy(x)).numpy()

    # the reductions and the clip as ufunc calls: numpy's function wrappers cost a few times the
    # work on the tiny arrays of the searches (same values, NaN propagates as in the wrappers)
    @staticmethod
    def clip(x, low=None, high=None):
        if low is not None:
            x = np.maximum(x, low)
        return x if high is None else np.minimum(x, high)

    sum, amax, amin = _reducer(np.add), _reducer(np.maximum), _reducer(np.minimum)
    all, any = _reducer(np.logical_and), _reducer(np.logical_or)

    @staticmethod
    def argmax(x, axis=None, keepdims=False):
        return x.argmax(axis=axis, keepdims=keepdims)

    @staticmethod
    def argmin(x, axis=None, keepdims=False):
        return x.argmin(axis=axis, keepdims=keepdims)

    @staticmethod
    def cummax(x: np.ndarray) -> np.ndarray:
        return np.maximum.accumulate(x, -1)

    @staticmethod
    def sort(x: np.ndarray) -> np.ndarray:
        # stable = timsort: sorted runs (the knot arrays below) merge in about linear time
        return np.sort(x, -1, kind="stable")

    @staticmethod
    def flip(x: np.ndarray) -> np.ndarray:
        return x[..., ::-1]

    @staticmethod
    def g(div, z: np.ndarray) -> np.ndarray:
        """``g(z)`` of ``div`` (:attr:`~mdboost.md.divergences.Divergence.g_array`; log(0) warnings: see errstate)."""
        return div.g_array(z)

    @staticmethod
    def errstate():
        return np.errstate(divide="ignore", invalid="ignore", over="ignore")  # inf budgets / inf terms, as in torch


TORCH, NUMPY = TorchOps(), NumpyOps()


def namespace_for(x: torch.Tensor, namespace=None):
    """``namespace`` if given, else :data:`NUMPY` where :func:`mdboost.md._router.on_numpy` (a CPU
    tensor that needs no gradient), :data:`TORCH` otherwise.

    Examples
    --------
    >>> import torch
    >>> namespace_for(torch.zeros(2)).name
    'numpy'
    >>> namespace_for(torch.zeros(2, requires_grad=True)).name
    'torch'
    >>> namespace_for(torch.zeros(2), TORCH).name
    'torch'
    """
    if namespace is not None:
        return namespace
    return NUMPY if on_numpy(x) else TORCH
