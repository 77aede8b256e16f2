"""f-divergence generators and the batched divergence ``D_f(pi || q)``.

``D_f(pi || q) = sum_i q_i f(pi_i / q_i)`` for a convex generator ``f`` with ``f(1) = 0``
(``docs/theory.md``, "Notation"). Shipped generators (:data:`DIVERGENCES`, in this order): ``kl``
(KL(pi||q)), ``rkl`` (KL(q||pi)), ``hellinger``, ``pearson``, ``neyman``, ``tv``, ``js``; plus the
Amari family :func:`alpha`.
Any convex callable can be used too (:func:`from_callable`).

Limits (documented in ``docs/theory.md``):

- ``q_i = 0 < pi_i``: the term ``q_i f(pi_i / q_i)`` is defined as its limit
  ``pi_i * lim_{z -> inf} f(z) / z`` (:attr:`Divergence.inf_slope`; may be ``+inf``).
- ``q_i = pi_i = 0``: the term is 0.
- ``pi_i = 0 < q_i``: the term is ``q_i f(0)`` (may be ``+inf``, e.g. ``rkl``).

The solvers work with the *standardized* generator ``g(z) = f(z) - f'(1) (z - 1)``
(paper, Theorem 3.12): it gives the same divergence between distributions, and ``g >= 0``
with ``g(1) = 0`` makes every prefix sum non-negative. For ``tv`` (no derivative at 1), ``g = f``.

Each shipped generator is written once below, its other forms beside it (:class:`Forms`: on a
Python float, on a numpy array, and the closed forms of ``kl`` and ``rkl``, ``docs/theory.md``
section 4); the solvers read them off the :class:`Divergence` (:attr:`Divergence.forms`,
:attr:`Divergence.g_float`, :attr:`Divergence.g_array`, :meth:`Divergence.g_numpy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Callable, NamedTuple

import numpy as np
import torch

from mdboost.md._checks import check_probs, compute_dtype
from mdboost.md.options import DIVERGENCES  # the names, torch-free (a config checks them before torch loads)

__all__ = [
    "DIVERGENCES",
    "Divergence",
    "GENERATORS",
    "alpha",
    "from_callable",
    "resolve",
    "f_divergence",
    "FLOOR",
    "names",
]


@dataclass(frozen=True)
class Divergence:
    """A convex generator ``f`` with ``f(1) = 0``.

    Attributes
    ----------
    name : str
        Short name (``"kl"``, ``"alpha(1.5)"``, ...).
    f : callable
        ``f(z)`` on a float tensor ``z >= 0`` (``z = 0`` must give the limit, possibly inf).
    fprime_one : float
        ``f'(1)``; for non-differentiable ``f`` (tv) any subgradient, with ``standardize=False``.
    inf_slope : float
        ``lim_{z -> inf} f(z) / z`` (may be ``math.inf``): the cost of mass where ``q_i = 0``.
    standardize : bool
        Whether :meth:`g` subtracts ``f'(1) (z - 1)`` (False only for tv-like generators).
    """

    name: str
    f: Callable[[torch.Tensor], torch.Tensor]
    fprime_one: float
    inf_slope: float
    standardize: bool = True

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        """``f(z)``, with a negative zero read as 0 (``f`` sees ``z + 0.0``: ``-0.0`` becomes ``+0.0``,
        which a generator such as ``neyman``'s ``(z - 1) ((z - 1) / z)`` would otherwise send to ``-inf``)."""
        return self.f(z + 0.0)

    def g(self, z: torch.Tensor) -> torch.Tensor:
        """Standardized generator ``g(z) = f(z) - f'(1) (z - 1)`` (``>= 0``, ``g(1) = 0``).

        Where ``f`` overflows for a huge ratio (``inf - inf``: NaN), the asymptote
        ``(lim f(z) / z - f'(1)) z`` is returned instead. A negative zero is read as 0 (as in
        :meth:`__call__`).
        """
        z = z + 0.0
        if not self.standardize or self.fprime_one == 0.0:
            out = self.f(z)
        else:
            out = self.f(z) - self.fprime_one * (z - 1.0)
        return torch.where(torch.isnan(out), (self.inf_slope - self.fprime_one) * z, out)

    def __getstate__(self):  # the fields only: the cached forms below are derived again after unpickling
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @cached_property
    def forms(self) -> "Forms":
        """The :class:`Forms` registered beside ``f`` below (empty for an ``f`` that is not shipped).

        The forms of ``g`` (``g_float``, ``g_array``, ``g_ratio``, ``log_form``) only where ``f'(1)``,
        the asymptote and the standardisation are the shipped generator's too (they fix ``g``).

        >>> resolve("kl").forms.log_form, resolve("hellinger").forms.log_form
        ((0, 1.0), None)
        >>> Divergence("kl2", resolve("kl").f, 2.0, math.inf).forms.log_form is None  # another g
        True
        """
        try:
            shipped = _SHIPPED.get(self.f)
        except TypeError:  # an unhashable callable: no registered form
            shipped = None
        if shipped is None:
            return Forms()
        ref, forms = shipped
        if (self.fprime_one, self.inf_slope, self.standardize) == (ref.fprime_one, ref.inf_slope, ref.standardize):
            return forms
        return Forms(forms.f_float, forms.f_array)

    @cached_property
    def g_float(self) -> Callable[[float], float] | None:
        """:meth:`g` on a Python float (the same values), or None where ``f`` has no float form
        (``alpha``, user callables). Python floats serve the search of one small row
        (:mod:`mdboost.md._scalar`), where a tiny array operation costs more than its arithmetic."""
        forms = self.forms
        if forms.g_float is not None or forms.f_float is None:
            return forms.g_float
        f, slope = forms.f_float, self.fprime_one if self.standardize else 0.0
        asym = self.inf_slope - self.fprime_one

        def g(z):
            try:
                out = f(z) - slope * (z - 1.0) if slope else f(z)
            except OverflowError:
                out = math.nan
            return asym * z if out != out else out  # NaN (inf - inf): the asymptote, as g

        return g

    def g_numpy(self, z: np.ndarray) -> np.ndarray:
        """:meth:`g` of a float64 numpy array: ``f`` by its registered numpy form (``rkl``'s ``-log z``:
        numpy's ``log``, within an ulp of torch's, at a fraction of two torch calls' cost on small
        rows), else :meth:`__call__` on a zero-copy view; the standardisation and the asymptote in numpy (the
        same IEEE operations in the same order). Call it with numpy's warnings off (``inf - inf`` is
        masked as in torch)."""
        f_array = self.forms.f_array
        out = f_array(z) if f_array is not None else self(torch.from_numpy(z)).numpy()  # -0.0 read as 0
        if self.standardize and self.fprime_one != 0.0:
            out = out - self.fprime_one * (z - 1.0)
        return np.where(np.isnan(out), (self.inf_slope - self.fprime_one) * z, out)

    @cached_property
    def g_array(self) -> Callable[[np.ndarray], np.ndarray]:
        """``g`` on a float64 numpy array in the fewest operations: the registered one-expression form
        (``kl``: numpy's ``log``, within an ulp of :meth:`g_numpy`), else :meth:`g_numpy`. For the
        evaluations of ``D_f`` on a segment (:mod:`mdboost.md._segment`)."""
        return self.g_numpy if self.forms.g_array is None else self.forms.g_array


class Forms(NamedTuple):
    """The other forms of one shipped generator, each giving the values of ``f`` or of its ``g``.

    ``f`` forms: ``f_float`` on a Python float (inf where torch gives inf), ``f_array`` on a float64
    numpy array (None: torch's ``f`` on a zero-copy view). ``g`` forms, for the closed forms of the
    solvers (``docs/theory.md``, section 4): ``g_float`` (one call on a Python float, else derived
    from ``f_float``), ``g_array`` (one numpy expression, else :meth:`Divergence.g_numpy`),
    ``g_ratio(z, lib)`` (the prefix sums' terms on the float64 ratios, ``lib`` torch or numpy: exact
    at ``z = 0``; else ``g`` on the sorted ratios) and ``log_form`` ``(w, sign)`` where
    ``q g(r) = sign (w log r - p + q)`` with ``w`` = ``p`` (0) or ``q`` (1) (the bucket sums then
    take one ``log`` per entry, :mod:`mdboost.md._histogram`).
    """

    f_float: Callable[[float], float] | None = None
    f_array: Callable[[np.ndarray], np.ndarray] | None = None
    g_float: Callable[[float], float] | None = None
    g_array: Callable[[np.ndarray], np.ndarray] | None = None
    g_ratio: Callable | None = None
    log_form: tuple[int, float] | None = None


_INF = math.inf


def _xlogx(z):  # z log z on a Python float, 0 at z = 0
    return 0.0 if z == 0 else z * math.log(z)


# kl: f(z) = z log z, g(z) = z log z - z + 1 = r log r - r + 1 (log form: w = p, sign +1)
def _kl(z):
    return torch.xlogy(z, z)


def _kl_g_float(z):  # inf at z = inf (the asymptote)
    if z == 0:
        return 1.0
    out = z * math.log(z) - (z - 1.0)
    return out if out == out else _INF


def _kl_g_array(z):  # log(0) warnings: call with numpy's warnings off
    return np.where(z > 0, z * np.log(z), 0.0) - (z - 1.0)


def _kl_g_ratio(z, lib):  # lib: torch or numpy (each its own log)
    return lib.where(z > 0, z * lib.log(z), 0.0) - z + 1


# rkl: f(z) = -log z, g(z) = -log z + z - 1 (log form: w = q, sign -1)
def _rkl(z):
    return -torch.log(z)


def _rkl_float(z):
    return _INF if z == 0 else -math.log(z)


def _rkl_array(z):
    return np.negative(np.log(z))


def _rkl_g_float(z):
    if z == 0:
        return _INF
    out = -math.log(z) + (z - 1.0)
    return out if out == out else _INF


def _hellinger(z):
    return (torch.sqrt(z) - 1.0) ** 2


def _hellinger_float(z):
    s = math.sqrt(z) - 1.0
    return s * s


def _pearson(z):
    return (z - 1.0) ** 2


def _pearson_float(z):
    s = z - 1.0
    return s * s


def _neyman(z):
    # (z - 1)^2 / z as (z - 1) ((z - 1) / z): the square alone overflows from z ~ 1.3e154 on, while
    # the value (about z) is finite up to the float range
    return (z - 1.0) * ((z - 1.0) / z)


def _neyman_float(z):
    s = z - 1.0
    return _INF if z == 0 else s * (s / z)


def _tv(z):
    return (z - 1.0).abs() / 2.0


def _tv_float(z):
    return abs(z - 1.0) / 2.0


def _js(z):
    return (torch.xlogy(z, z) - torch.xlogy(1.0 + z, (1.0 + z) / 2.0)) / 2.0


def _js_float(z):
    w = 1.0 + z
    return (_xlogx(z) - (0.0 if w == 0 else w * math.log(w / 2.0))) / 2.0


_SHIPPED_FORMS = {  # name (DIVERGENCES, in its order): (generator, its forms)
    name: (Divergence(name, *generator), forms) for name, (generator, forms) in zip(DIVERGENCES, (
        ((_kl, 1.0, math.inf), Forms(_xlogx, None, _kl_g_float, _kl_g_array, _kl_g_ratio, (0, 1.0))),
        ((_rkl, -1.0, 0.0), Forms(_rkl_float, _rkl_array, _rkl_g_float, log_form=(1, -1.0))),
        ((_hellinger, 0.0, 1.0), Forms(_hellinger_float)),
        ((_pearson, 0.0, math.inf), Forms(_pearson_float)),
        ((_neyman, 0.0, 1.0), Forms(_neyman_float)),
        ((_tv, 0.0, 0.5, False), Forms(_tv_float)),  # standardize=False: f has no derivative at 1
        ((_js, 0.0, math.log(2.0) / 2.0), Forms(_js_float)),
    ), strict=True)}
_SHIPPED = {div.f: (div, forms) for div, forms in _SHIPPED_FORMS.values()}  # f -> (generator, forms)

GENERATORS: dict[str, Divergence] = {name: div for name, (div, _) in _SHIPPED_FORMS.items()}


def names() -> list[str]:
    """Names accepted by :func:`resolve` (plus ``"alpha:<a>"``)."""
    return sorted(DIVERGENCES) + ["alpha:<a>"]


def alpha(a: float) -> Divergence:
    """Amari alpha-divergence ``f_a(z) = 4 / (1 - a^2) (1 - z^((1+a)/2))``, ``a`` not in {-1, 1}."""
    a = float(a)
    if not math.isfinite(a) or a in (-1.0, 1.0):
        raise ValueError(f"alpha parameter a must be finite and not in {{-1, 1}}, got {a!r}")
    e = (1.0 + a) / 2.0
    c = 4.0 / (1.0 - a * a)

    def f(z, c=c, e=e):
        return c * (1.0 - torch.pow(z, e))

    inf_slope = math.inf if e > 1.0 else 0.0
    return Divergence(f"alpha({a:g})", f, -c * e, inf_slope)


def from_callable(f: Callable, name: str | None = None, inf_slope: float | None = None) -> Divergence:
    """Wrap a user convex generator ``f`` (torch tensor in, tensor out; ``f(1) = 0``).

    ``f'(1)`` is taken by autograd in float64 (central finite difference if autograd fails);
    ``lim f(z)/z`` is estimated as ``f(z)/z`` at ``z = 1e12`` (``inf`` above ``1e3``, 0 below
    ``1e-6`` in magnitude) unless ``inf_slope`` is given. Give it where ``pi`` may put mass on
    ``q = 0`` (``support="any"``, ``f_divergence`` of such a ``pi``): the estimate misreads slowly
    growing slopes (``z log z``: 27.6 at ``1e12``, truly ``inf``; docs/theory.md, section 1).
    """
    if not callable(f):
        raise ValueError(f"divergence must be a name or a callable, got {f!r}")
    one = torch.ones((), dtype=torch.float64)
    f1 = float(f(one))
    if not abs(f1) < 1e-9:
        raise ValueError(f"divergence generator must satisfy f(1) = 0, got f(1) = {f1!r}")
    try:
        z = one.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(f(z), z)
        d1 = float(grad)
    except (RuntimeError, TypeError):
        h = 1e-6
        d1 = float((f(one + h) - f(one - h)) / (2 * h))
    if not math.isfinite(d1):
        raise ValueError(f"divergence generator must be differentiable at 1, got f'(1) = {d1!r}")
    if inf_slope is None:
        big = torch.tensor(1e12, dtype=torch.float64)
        s = float(f(big) / big)
        inf_slope = math.inf if s > 1e3 else (0.0 if abs(s) < 1e-6 else s)
    label = name or getattr(f, "__name__", "custom")
    return Divergence(label, f, d1, float(inf_slope))


def resolve(divergence) -> Divergence:
    """Return the :class:`Divergence` for a name, ``"alpha:<a>"``, a Divergence or a callable."""
    if isinstance(divergence, Divergence):
        return divergence
    if isinstance(divergence, str):
        key = divergence.strip().lower()
        if key in GENERATORS:
            return GENERATORS[key]
        if key.startswith("alpha:") or key.startswith("alpha="):
            try:
                return alpha(float(key[6:]))
            except ValueError as exc:
                raise ValueError(f"divergence {divergence!r}: {exc}") from exc
        raise ValueError(f"divergence must be one of {names()} or a callable, got {divergence!r}")
    if callable(divergence):
        return from_callable(divergence)
    raise TypeError(f"divergence must be a name (one of {names()}), a Divergence or a callable, got {divergence!r}")


FLOOR = {torch.float64: 1e-290, torch.float32: 1e-30}
"""Per dtype: a coordinate of :func:`f_divergence` with ``pi_i`` and ``q_i`` both below it adds 0
(``docs/theory.md``, section 9): a clamp ``(1 - b) q_i`` of such a ``q_i`` can underflow to 0,
which ``f(0) = inf`` (``rkl``, ``alpha`` below -1) would turn into an infinite divergence."""


def f_divergence(
    output_probs: torch.Tensor,  # [..., V]
    target_probs: torch.Tensor,  # [..., V]
    divergence="kl",
    *,
    validate: bool = True,
) -> torch.Tensor:  # [...]
    """Batched ``D_f(pi || q) = sum_i q_i f(pi_i / q_i)`` with the limits of the module docstring.

    Parameters
    ----------
    output_probs : torch.Tensor of shape (..., V)
        ``pi`` (for example a mentored distribution).
    target_probs : torch.Tensor of shape (..., V)
        ``q``, the target distribution (broadcastable against ``output_probs``).
    divergence : str, Divergence or callable, default="kl"
    validate : bool, default=True
        Check the inputs: floating tensors, finite, non-negative, rows summing to 1 (the sum
        tolerance of ``docs/theory.md``, section 9). False skips the value checks.

    Returns
    -------
    torch.Tensor of shape (...)
        Computed in float64, returned in the promoted dtype of the inputs (float32 for half
        precision); ``>= 0`` (rounding below 0 is clamped) and may be ``+inf``. A ratio
        ``pi_i / q_i`` that overflows float64 (or whose term does) counts as ``q_i = 0``; a
        coordinate where both ``pi_i`` and ``q_i`` are below :data:`FLOOR` counts as 0.

    Examples
    --------
    >>> p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    >>> float(f_divergence(p, torch.tensor([0.25, 0.75], dtype=torch.float64), "tv"))
    0.25
    """
    pi = check_probs("output_probs", output_probs, validate=validate)
    q = check_probs("target_probs", target_probs, validate=validate)
    div = resolve(divergence)
    try:
        pi, q = torch.broadcast_tensors(pi, q)
    except RuntimeError as exc:
        raise ValueError(f"output_probs and target_probs must broadcast together, got shapes "
                         f"{tuple(pi.shape)} and {tuple(q.shape)}") from exc
    out_dtype = compute_dtype(torch.promote_types(pi.dtype, q.dtype))
    floor = FLOOR[torch.float64 if out_dtype == torch.float64 else torch.float32]
    pi, q = pi.to(torch.float64), q.to(torch.float64)
    # both entries below the floor: treated as zero (pi_i = (1 - b) q_i may underflow to 0)
    below = (q < floor) & (pi < floor)
    pi, q = torch.where(below, 0.0, pi), torch.where(below, 0.0, q)
    pos = q > 0
    z = torch.where(pos, pi / torch.where(pos, q, torch.ones_like(q)), torch.ones_like(q))
    inside = q * div(z)
    # q_i = 0 < pi_i, and the overflow regime of a tiny q_i: the limit pi_i * lim f(z) / z
    outside = torch.where(pi > 0, pi * div.inf_slope, torch.zeros_like(pi)) if div.inf_slope else torch.zeros_like(pi)
    limit = ~pos | torch.isinf(z) | torch.isnan(inside)
    terms = torch.where(limit, outside, inside)
    return terms.sum(dim=-1).clamp(min=0).to(out_dtype)
