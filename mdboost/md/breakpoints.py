"""Breakpoints of the curve C(p, q): one sort, then dual, exact primal and bound queries.

Implements the paper's Definition 3.11 (the clamp couples ``(a, b)``), Lemmas 5.2/5.3 (the
breakpoints lie on C(p, q) and the curve is continuous and strictly increasing, so a query
between two breakpoints is an interpolation) and the querying procedures of Section 5 (the
sort and the prefix sums live in :mod:`mdboost.md._sums`):

- dual (min acceptance): ``O(log V)``, f-independent (Theorem 3.13);
- exact primal (max divergence): a prefix sum of ``q_i g(r_i)`` over the sorted ratios makes
  ``D_f`` at any point of the curve ``O(1)`` once its segment is known; a batched search over
  the breakpoints finds the segment, a bracketed secant search the point inside it;
- bound primal: the same search on the Theorem 3.12 upper bound (never exceeds the budget).

Parametrisation. Sort ``r_i = p_i / q_i`` ascending (``q_i = 0 < p_i`` gives ``r_i = inf``;
``p_i = q_i = 0`` is set to ``r_i = 1``). Points of the curve are indexed by the excess mass
``m = E(a) = F(b)``, with ``P_acc = 1 - m``; ``m`` decreases from ``TV(p, q)`` (``pi = q``)
to ``p(q = 0)`` (the end: ``pi = p`` on the support of q, up to the B clamp). With ``A`` =
sorted positions ``>= j`` and ``B`` = positions ``< k``:
``a = (P_suf[j] - m) / Q_suf[j] - 1`` and ``b = 1 - (m + P_pre[k]) / Q_pre[k]``.
The A-breakpoints ``m = E(r_j - 1) = P_suf[j] - r_j Q_suf[j]`` decrease in ``j`` and the
B-breakpoints ``m = F(1 - r_k) = r_k Q_pre[k] - P_pre[k]`` increase in ``k``, so locating a
point is a search in the sorted order. All sums are accumulated in float64; the sort stays in
the input dtype. The searches themselves live in :mod:`mdboost.md._search`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from mdboost.md import _locate, _search
from mdboost.md._checks import check_budget, check_pair
from mdboost.md._segment import Segment, SortedSums, ab_on, divergence_on, make_segment
from mdboost.md._router import numpy_sums
from mdboost.md._sums import ACC_DTYPE, neutral_ratios, _cumsums_np, _prefix_sums_np, _sort_rows, _cumsums, _prefix_sums, _mass_sums, _bcast
from mdboost.md._xp import TORCH
from mdboost.md.clamp import point_to_dtype
from mdboost.md.divergences import Divergence, resolve

class CurvePoint(NamedTuple):
    """A point ``(a, b)`` of C(p, q) and its acceptance probability ``1 - E(a)``."""

    a: torch.Tensor  # [...]
    b: torch.Tensor  # [...]
    acceptance: torch.Tensor  # [...]


take = TORCH.take  # arr[n, idx[n, ...]] for arr [N, L] and idx [N, ...]


def acceptance_of(m: torch.Tensor) -> torch.Tensor:
    """``P_acc = 1 - m`` clamped to ``[0, 1]`` (rounding never leaves the interval)."""
    return (1 - m).clamp(0.0, 1.0)


class Breakpoints:
    """The breakpoint structure of C(p, q) for a batch of drafter/target pairs.

    Build it with :meth:`build`; query it with :meth:`for_acceptance` (dual),
    :meth:`for_divergence` (exact primal), :meth:`for_divergence_bound` (Theorem 3.12 bound),
    :meth:`divergence_at` and :meth:`curve`. Queries take budgets broadcastable to the batch
    shape ``draft_probs.shape[:-1]`` and return tensors of that shape in the input dtype
    (float32 for float16 / bfloat16 inputs, which are computed in float32).

    For the solvers built on it (the ``N`` rows flatten the batch shape): :meth:`arrays` (the
    sorted sums), :attr:`ratios`, the sums and breakpoints at sorted positions (:meth:`p_pre`,
    :meth:`knot_a`, ...), :meth:`segment`, :meth:`prefix`, and the steps of the queries in float64
    [N, 1] (:meth:`flat_budget`, :meth:`clip_mass`, :meth:`point64`, :meth:`primal64`,
    :meth:`to_output`).

    Examples
    --------
    >>> import torch
    >>> p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    >>> q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    >>> bp = Breakpoints.build(p, q)
    >>> round(float(bp.sd_acceptance), 6)
    0.5
    >>> round(float(bp.for_acceptance(0.6).acceptance), 6)
    0.6
    """

    def __init__(self, r_sorted, p_sorted, q_sorted, batch_shape, dtype, *, normalize: bool = False, namespace=None):
        self.batch_shape = torch.Size(batch_shape)
        self.dtype = dtype
        self.vocab = r_sorted.shape[-1]
        self._r = r_sorted  # [N, V] input dtype, sorted ascending
        self.namespace = namespace  # of the sums and the searches (None: mdboost.md._xp.namespace_for)
        self._prefix_cache: dict = {}
        self._arrays: dict = {}  # namespace name -> SortedSums
        self._np = numpy_sums(r_sorted, namespace)
        if self._np:  # small CPU rows: the same sums with numpy's cheaper tiny ops
            self._init_numpy(r_sorted.numpy(), p_sorted.numpy(), q_sorted.numpy(), normalize)
            return
        p64, self._q = p_sorted.to(ACC_DTYPE), q_sorted.to(ACC_DTYPE)  # [N, V] float64, by ratio
        threshold, self._r_cmp, self.normalized = 1.0, r_sorted, False
        if normalize and r_sorted.shape[0]:  # rows within the sum tolerance, rescaled in float64
            sp, sq = p64.sum(-1, keepdim=True), self._q.sum(-1, keepdim=True)
            if bool(((sp != 1) | (sq != 1)).any()):
                p64, self._q, self.normalized = p64 / sp, self._q / sq, True
                threshold = (sp / sq).to(r_sorted.dtype)  # r_i (sq / sp) < 1  <=>  r_i < sp / sq
        # exclusive prefix sums of p and q (index k: sum_{i < k}) and suffix sums read backwards
        # (index V - j: sum_{i >= j}, accurate for small tails), each [N, V + 1]
        self._cp, self._cq, self._rp, self._rq = _cumsums(p64, self._q)
        n_fin = torch.searchsorted(r_sorted, torch.full_like(r_sorted[:, :1], math.inf))
        if r_sorted.shape[0] and bool((take(self._rq, self.vocab - n_fin) > 0).any()):
            # a ratio p_i / q_i that overflows the input dtype counts as q_i = 0 (docs/theory.md,
            # section 9): those q_i leave the sums, so that every q > 0 has a finite ratio
            self._q = torch.where(torch.isinf(r_sorted), 0.0, self._q)
            self._cp, self._cq, self._rp, self._rq = _cumsums(p64, self._q)
        if self.normalized:  # the ratios of the rescaled rows; 0/0 stays neutral (at the threshold)
            neutral = (1.0 / threshold.to(ACC_DTYPE)).expand_as(p64)
            self._ratio = torch.where(self._q > 0, p64 / self._q, torch.where(p64 > 0, math.inf, neutral))
            self._r_cmp = self._ratio
        elif r_sorted.dtype == ACC_DTYPE:  # the same division; 0/0 rows (r = 1) are never read as knots
            self._ratio = r_sorted
        else:
            self._ratio = torch.where(self._q > 0, p64 / self._q, math.inf)  # [N, V] float64
        del p64  # p is not kept: q and the ratio give every later term (fewer fresh pages)
        col = torch.ones_like(r_sorted[:, :1]) * threshold
        self._n_lt = torch.searchsorted(r_sorted, col, right=False)  # r < 1
        self._n_le = torch.searchsorted(r_sorted, col, right=True)  # r <= 1
        self._n_fin = torch.searchsorted(r_sorted, col * math.inf, right=False)  # r finite
        self._j_max = torch.maximum(self._n_fin - 1, self._n_le)  # last A segment (the end)
        self._tv = self.q_pre(self._n_lt) - self.p_pre(self._n_lt)  # [N, 1] = F(0) = TV(p, q)
        self._m_end = torch.minimum(self.p_suf(self._n_fin), self._tv)  # [N, 1] = p(q = 0)

    def _init_numpy(self, r, p, q, normalize: bool):
        """:meth:`__init__` on numpy arrays [N, V] (the same steps; counts instead of ``searchsorted``)."""
        vocab = self.vocab
        p64, q64 = p.astype(np.float64), q.astype(np.float64)
        threshold, r_cmp, self.normalized = 1.0, r, False
        if normalize:
            sp, sq = p64.sum(-1, keepdims=True), q64.sum(-1, keepdims=True)
            if ((sp != 1) | (sq != 1)).any():
                p64, q64, self.normalized = p64 / sp, q64 / sq, True
                threshold = (sp / sq).astype(r.dtype)
        sums = _cumsums_np(p64, q64)
        inf_r = np.isinf(r)
        if np.where(inf_r, q64, 0.0).any():  # overflowed ratios count as q_i = 0 (docs/theory.md, section 9)
            q64 = np.where(inf_r, 0.0, q64)
            sums = _cumsums_np(p64, q64)
        cp, cq, rp, rq = sums
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.normalized:
                neutral = 1.0 / np.asarray(threshold, dtype=np.float64)
                ratio = np.where(q64 > 0, p64 / q64, np.where(p64 > 0, math.inf, neutral))
                r_cmp = ratio
            elif r.dtype == np.float64:
                ratio = r
            else:
                ratio = np.where(q64 > 0, p64 / q64, math.inf)
        thr = np.asarray(threshold, dtype=r.dtype)
        # counts on sorted rows = searchsorted (left: <, right: <=)
        n_lt = (r < thr).sum(-1, keepdims=True, dtype=np.int64)
        n_le = (r <= thr).sum(-1, keepdims=True, dtype=np.int64)
        n_fin = vocab - inf_r.sum(-1, keepdims=True, dtype=np.int64)
        j_max = np.maximum(n_fin - 1, n_le)
        rows = np.arange(0, cq.size, vocab + 1).reshape(-1, 1)  # flat offsets of the rows of [N, V + 1]
        tv = cq.take(n_lt + rows) - cp.take(n_lt + rows)
        m_end = np.minimum(rp.take(vocab - n_fin + rows), tv)
        t = torch.from_numpy
        self._q, self._ratio, self._r_cmp = t(q64), t(ratio), t(r_cmp)
        self._cp, self._cq, self._rp, self._rq = (t(x) for x in sums)
        self._n_lt, self._n_le, self._n_fin, self._j_max, self._tv, self._m_end = (
            t(x) for x in (n_lt, n_le, n_fin, j_max, tv, m_end))
        self._arrays["numpy"] = SortedSums(cp, cq, rp, rq, ratio, n_lt, n_le, j_max, tv, m_end, q64, n_fin)
        self._np_r_cmp, self._np_q = r_cmp, q64

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, draft_probs: torch.Tensor, target_probs: torch.Tensor, *, validate: bool = True,
              normalize: bool | None = None, namespace=None) -> "Breakpoints":
        """Sort the ratios once and accumulate the prefix sums: ``O(V log V)``.

        Parameters
        ----------
        draft_probs : torch.Tensor of shape (..., V)
            Drafter distributions ``p`` (rows sum to 1).
        target_probs : torch.Tensor of shape (..., V)
            Target distributions ``q``.
        validate : bool, default=True
            Check the inputs (raises ValueError naming the bad argument); rows within the sum
            tolerance are then rescaled to sum to 1 in float64 (``docs/theory.md``, section 9).
            False: the rows are trusted to sum to 1 and used as given.
        normalize : bool or None, default=None
            Rescale the rows in float64 (None: when ``validate``).
        namespace : optional
            ``mdboost.md._xp.TORCH`` sorts, sums and searches in torch on CPU rows too (the
            accelerators' path); None: the rule (:mod:`mdboost.md._router`). Kept as
            :attr:`namespace`.
        """
        p, q = check_pair(draft_probs, target_probs, validate=validate)
        return cls.from_checked(p, q, validate if normalize is None else normalize, namespace)

    @classmethod
    def from_checked(cls, p: torch.Tensor, q: torch.Tensor, normalize: bool, namespace=None) -> "Breakpoints":
        """:meth:`build` on a pair ``[..., V]`` already through :func:`~mdboost.md._checks.check_pair`
        (one dtype, CPU rows of float32 / float64 or any rows of the compute dtype); ``normalize`` and
        ``namespace`` as in :meth:`build`."""
        vocab = p.shape[-1]
        p2, q2 = p.reshape(-1, vocab), q.reshape(-1, vocab)
        if numpy_sums(p2, namespace) and p2.dtype == q2.dtype:  # the same division in numpy (a tiny torch op costs more)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                r = torch.from_numpy(neutral_ratios(p2.numpy() / q2.numpy()))
        else:
            r = neutral_ratios(torch.div(p2, q2))
        r_sorted, p_sorted, q_sorted = _sort_rows(r, p2, q2, namespace)
        return cls(r_sorted, p_sorted, q_sorted, p.shape[:-1], p.dtype, normalize=normalize, namespace=namespace)

    @property
    def ratios(self) -> torch.Tensor:  # [N, V]
        """The sorted ratios ``r_i = p_i / q_i`` [N, V] in the input dtype, ascending (``inf`` where
        ``q_i = 0 < p_i``, 1 where ``p_i = q_i = 0``); ``N`` rows flatten the batch shape."""
        return self._r

    @property
    def backend(self) -> str:
        """``"numpy"`` where the sums were built with numpy (small CPU rows, the same values), else ``"torch"``."""
        return "numpy" if self._np else "torch"

    # -------------------------------------------------- sums at sorted positions
    def p_pre(self, k):
        """``sum_{i < k} p_i`` in the sorted order (float64), for long ``k`` in ``[0, V]`` of shape [N, ...]."""
        return take(self._cp, k)

    def q_pre(self, k):
        return take(self._cq, k)

    def p_suf(self, j):
        """``sum_{i >= j} p_i`` in the sorted order (float64), accurate for small tails."""
        return take(self._rp, self.vocab - j)

    def q_suf(self, j):
        return take(self._rq, self.vocab - j)

    def ratio(self, i):
        """``p_i / q_i`` at sorted position ``i`` in float64 (``inf`` where ``q_i = 0 < p_i``)."""
        return take(self._ratio, i.clamp(max=self.vocab - 1))

    def knot_a(self, j):
        """``m`` at the A-breakpoint ``a = r_j - 1`` (the end point ``m_end`` for ``j >= j_max``)."""
        m = self.p_suf(j) - self.ratio(j) * self.q_suf(j)
        m = torch.where(j >= _bcast(self._j_max, j), _bcast(self._m_end, j), m)
        return torch.minimum(torch.maximum(m, _bcast(self._m_end, j)), _bcast(self._tv, j))

    def knot_b(self, k):
        """``m`` at the B-breakpoint ``b = 1 - r_k`` (``TV`` for ``k >= n_lt``)."""
        m = self.ratio(k) * self.q_pre(k) - self.p_pre(k)
        return torch.where(k >= _bcast(self._n_lt, k), _bcast(self._tv, k), m)

    # ----------------------------------------------------- divergence on a segment
    def prefix(self, div: Divergence):
        """Sums of ``q_i g(r_i)`` anchored at ``r = 1``, for one generator (cached).

        One array [N, V + 1]: ``mid[k] = sum_{k <= i < n_lt}`` for ``k <= n_lt`` (reverse cumsum of
        the ``r < 1`` part) and ``mid[j] = sum_{n_le <= i < j}`` for ``j >= n_le`` (cumsum of the
        ``r > 1`` part); both are 0 in ``[n_lt, n_le]``, so ``mid[k] + mid[j]`` is the M-set sum. Each range sum is a
        partial sum that starts next to ``r = 1``, so there is no cancellation between large
        terms (``q_i g(r_i)`` explodes for extreme ratios) and ``+inf`` terms stay exact.
        """
        if div not in self._prefix_cache:
            if self._np:
                sums = self._arrays["numpy"]
                mid = _prefix_sums_np(self._np_r_cmp, self._np_q, sums.ratio, sums.n_lt, sums.n_le, div)
                self._prefix_cache[div] = torch.from_numpy(mid)
            else:
                self._prefix_cache[div] = _prefix_sums(self._r_cmp, self._q, self._ratio, self._n_lt, self._n_le, div)
        return self._prefix_cache[div]

    def mass_prefix(self) -> torch.Tensor:
        """Sums of ``q_i`` anchored at ``r = 1`` [N, V + 1] (cached): ``q(M)`` for the Thm 3.12 bound.

        ``mass[k] = sum_{k <= i < n_le} q_i`` for ``k <= n_le`` and ``mass[j] = sum_{n_le <= i < j} q_i``
        for ``j >= n_le``, so ``mass[k] + mass[j] = q(M)`` without the cancellation of
        ``Q_pre[j] - Q_pre[k]`` (a tiny ``q(M)`` next to a large ``q(B)`` would round to 0).
        """
        if "mass" not in self._prefix_cache:
            self._prefix_cache["mass"] = _mass_sums(self._q, self._n_le)
        return self._prefix_cache["mass"]

    def arrays(self, xp=TORCH) -> SortedSums:
        """The sorted sums (:class:`~mdboost.md._segment.SortedSums`: float64 sums [N, V + 1], ratios and
        ``q`` [N, V] by ratio, long counts and float64 ``TV``, ``m_end`` [N, 1]) in the namespace ``xp``
        (:mod:`mdboost.md._xp`; numpy: zero-copy views of CPU tensors, made once).

        >>> p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
        >>> q = torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64)
        >>> s = Breakpoints.build(p, q).arrays()
        >>> s.ratio.tolist(), s.q.tolist(), s.n_lt.tolist(), s.n_le.tolist(), s.tv.tolist()
        ([[0.5, 1.0, 2.0]], [[0.5, 0.25, 0.25]], [[1]], [[2]], [[0.25]])
        """
        if xp.name not in self._arrays:
            t = (self._cp, self._cq, self._rp, self._rq, self._ratio, self._n_lt, self._n_le, self._j_max,
                 self._tv, self._m_end, self._q, self._n_fin)
            self._arrays[xp.name] = SortedSums(*(xp.asarray(x) for x in t))
        return self._arrays[xp.name]

    def segment(self, j, k, div: Divergence | None, bound: bool) -> Segment:
        """The :class:`Segment` with ``A = [j, V)`` and ``B = [0, k)`` (shapes of ``j``).

        ``div=None`` leaves ``rest`` empty (enough for :meth:`ab`).
        """
        mid = None if div is None else self.mass_prefix() if bound else self.prefix(div)
        return make_segment(TORCH, self.arrays(), j, k, mid, bound)

    @staticmethod
    def ab(m, seg: Segment, tv=None):
        """``(a, b)`` at excess mass ``m`` on a segment; exactly ``(0, 0)`` at ``m >= tv`` if given."""
        a, b = ab_on(TORCH, m, seg)
        if tv is None:
            return a, b
        at_sd = m >= tv
        return torch.where(at_sd, 0.0, a), torch.where(at_sd, 0.0, b)

    def div_on(self, m, seg: Segment, div: Divergence, bound: bool):
        """``D_f`` (or the Thm 3.12 upper bound) at ``m`` on a segment (:func:`divergence_on`)."""
        return divergence_on(TORCH, m, seg, div, bound)

    def div_at(self, m, j, k, div: Divergence, bound: bool):
        return self.div_on(m, self.segment(j, k, div, bound), div, bound)

    # ---------------------------------------------------------------- queries
    def flat_budget(self, value, name, upper=None, validate=True):
        """``value`` (a number or a tensor broadcastable to the batch shape) as float64 [N, 1], checked
        as the argument ``name`` (:func:`~mdboost.md._checks.check_budget`, at most ``upper``)."""
        t = check_budget(name, value, self.batch_shape, self._r.device, upper=upper, validate=validate)
        return t.reshape(self._r.shape[0], 1)

    def to_output(self, x):
        """A per-row tensor ([N, 1] or [N]) in the batch shape and the output dtype."""
        return x.reshape(self.batch_shape).to(self.dtype)

    def point_to_output(self, a, b, acceptance) -> CurvePoint:
        """A float64 point (fields [N, 1] or [N]) in the batch shape and the output dtype, ``(a, b)``
        rounded towards ``pi = q`` (:func:`~mdboost.md.clamp.point_to_dtype`: the budget still holds)."""
        a, b = point_to_dtype(a.reshape(self.batch_shape), b.reshape(self.batch_shape), self.dtype)
        return CurvePoint(a, b, self.to_output(acceptance))

    def _empty_point(self) -> CurvePoint:  # a batch without rows
        empty = torch.zeros(self.batch_shape, dtype=self.dtype, device=self._r.device)
        return CurvePoint(empty, empty.clone(), empty.clone())

    def point64(self, m) -> CurvePoint:  # [N, 1] float64 fields
        """The curve point at excess mass ``m`` [N, 1] float64 (inside ``[m_end, TV]``, see
        :meth:`clip_mass`), its fields float64 [N, 1]; exactly ``a = b = 0`` at ``m >= TV``."""
        j, k = _locate.locate_j(self, m), _locate.locate_k(self, m)
        a, b = self.ab(m, self.segment(j, k, None, False), _bcast(self._tv, m))
        return CurvePoint(a, b, acceptance_of(m))

    def _point(self, m) -> CurvePoint:
        if not self._r.shape[0]:
            return self._empty_point()
        return self.point_to_output(*self.point64(m))

    def clip_mass(self, acceptance):
        """The excess mass ``m = 1 - acceptance`` [N, 1] float64, clipped to the curve's ``[m_end, TV]``."""
        return torch.minimum(torch.maximum(1 - acceptance, self._m_end), self._tv)

    @property
    def sd_acceptance(self) -> torch.Tensor:  # [...]
        """Acceptance of standard SD, ``1 - TV(p, q)`` (the curve's start)."""
        return self.to_output(acceptance_of(self._tv))

    @property
    def max_acceptance(self) -> torch.Tensor:  # [...]
        """Acceptance at the curve's end, ``1 - p(q = 0)``."""
        return self.to_output(acceptance_of(self._m_end))

    def for_acceptance(self, min_acceptance, *, validate: bool = True) -> CurvePoint:
        """Dual: the curve point with acceptance ``min_acceptance`` (f-independent, Theorem 3.13).

        Targets below the SD acceptance give ``a = b = 0`` (``pi = q``); targets above
        :attr:`max_acceptance` give the curve's end (the best achievable).
        """
        return self._point(self.clip_mass(self.flat_budget(min_acceptance, "min_acceptance", 1.0, validate)))

    def for_divergence(self, max_divergence, divergence="kl", *, validate: bool = True) -> CurvePoint:
        """Exact primal: the curve point where ``D_f(pi || q) = max_divergence`` (Thm 3.7, Cor 3.10).

        Budgets at or above ``D_f`` at the curve's end give the end point.
        """
        return self._primal(max_divergence, divergence, False, validate)[0]

    def for_divergence_bound(self, max_divergence, divergence="kl", *, validate: bool = True) -> CurvePoint:
        """Conservative primal on the Theorem 3.12 upper bound: ``D_f <= max_divergence`` always."""
        return self._primal(max_divergence, divergence, True, validate)[0]

    def for_divergence_with_value(self, max_divergence, divergence="kl", *,
                                  validate: bool = True) -> tuple[CurvePoint, torch.Tensor]:
        """:meth:`for_divergence` and ``D_f(pi || q)`` at the solution, without a second search."""
        point, budget, value = self.primal64(max_divergence, divergence, False, validate, with_value=True)
        if not self._r.shape[0]:
            return self._empty_point(), self.to_output(budget.reshape(-1))
        value = torch.where(budget <= 0, 0.0, value.clamp(min=0))  # budget 0: pi = q
        return self.point_to_output(*point), self.to_output(value)

    def _primal(self, max_divergence, divergence, bound, validate, with_value=False):
        """The primal point, the flat budget [N, 1] and ``D_f`` at the point (if ``with_value``)."""
        point, budget, value = self.primal64(max_divergence, divergence, bound, validate, with_value)
        if not self._r.shape[0]:
            return self._empty_point(), budget, value
        return self.point_to_output(*point), budget, value

    def primal64(self, max_divergence, divergence, bound, validate, with_value=False):
        """The primal point (float64 [N, 1] fields, before the output dtype; None for a batch without
        rows), the checked budget [N, 1] and ``D_f`` at the point [N, 1] (None unless ``with_value``).

        ``bound``: on the Theorem 3.12 upper bound (:meth:`for_divergence_bound`); ``validate``: check
        ``max_divergence`` (:meth:`flat_budget`).
        """
        div = resolve(divergence)
        budget = self.flat_budget(max_divergence, "max_divergence", validate=validate)
        if not self._r.shape[0]:
            return None, budget, (budget if with_value else None)
        a, b, m, value = _search.primal_point(self, budget, div, bound, with_value)
        return CurvePoint(a, b, acceptance_of(m)), budget, value

    def divergence_at(self, acceptance, divergence="kl", *, bound: bool = False, validate: bool = True) -> torch.Tensor:
        """``D_f(pi || q)`` (or its Thm 3.12 upper bound) at the curve point of given acceptance.

        ``acceptance`` is clipped to ``[sd_acceptance, max_acceptance]``; ``O(log V)``.
        ``validate=False`` skips the range check of ``acceptance`` (values are clipped anyway).
        """
        m = self.clip_mass(self.flat_budget(acceptance, "acceptance", 1.0, validate))
        div = resolve(divergence)
        if not self._r.shape[0]:
            return self.to_output(m.reshape(-1))
        j, k = _locate.locate_j(self, m), _locate.locate_k(self, m)
        value = self.div_at(m, j, k, div, bound)
        return self.to_output(torch.where(m >= self._tv, 0.0, value.clamp(min=0)))

    def curve(self) -> CurvePoint:
        """All breakpoints of the curve sorted by acceptance, shape ``(..., 2V + 1)``.

        Includes the SD start (``a = b = 0``) and the end point; unused slots are NaN (last).
        """
        n, vocab = self._r.shape
        if not n:
            empty = torch.zeros(self.batch_shape + (2 * vocab + 1,), dtype=self.dtype, device=self._r.device)
            return CurvePoint(empty, empty.clone(), empty.clone())
        idx = torch.arange(vocab, device=self._r.device).expand(n, vocab)
        nan = torch.full((n, vocab), math.nan, dtype=ACC_DTYPE, device=self._r.device)
        m_a = torch.where((idx >= self._n_le) & (idx <= self._j_max), self.knot_a(idx), nan)
        m_b = torch.where(idx < self._n_lt, self.knot_b(idx), nan)
        acc = torch.sort(1 - torch.cat([self._tv, m_a, m_b], dim=-1), dim=-1).values  # NaN last
        valid = ~torch.isnan(acc)
        m = self.clip_mass(torch.where(valid, acc, 0.0))
        j, k = _locate.locate_j(self, m), _locate.locate_k(self, m)
        a, b = self.ab(m, self.segment(j, k, None, False), self._tv)
        shape = self.batch_shape + (m.shape[-1],)
        a, b, acc = (torch.where(valid, x, math.nan).reshape(shape) for x in (a, b, acceptance_of(m)))
        return CurvePoint(*point_to_dtype(a, b, self.dtype), acc.to(self.dtype))
