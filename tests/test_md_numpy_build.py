"""Small CPU rows build the breakpoint sums in numpy: the same structure as the torch build.

``Breakpoints`` builds its sorted sums and prefix sums with numpy for CPU rows up to
``_router.NUMPY_VOCAB`` (a tiny numpy op costs a fraction of a torch one) and with torch otherwise
(forced here by ``namespace=TORCH``).
Both builds must give the same sums and the same answers to every query, for every divergence,
on rows with zeros in p or in q, peaked rows, p == q, batched and single rows, float32 and float64.
"""

import numpy as np
import pytest
import torch

from mdboost.md import _router, _sums
from mdboost.md._xp import TORCH
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import GENERATORS
from mdboost.md.solve import _solve, solve
from tests._md_pairs import dirichlet_pairs

FIELDS = ("q", "ratio", "cp", "cq", "rp", "rq", "n_lt", "n_le", "n_fin", "j_max", "tv", "m_end")
BUDGETS = torch.tensor([0.0, 1e-4, 0.01, 0.1, 1.0, float("inf")], dtype=torch.float64)


def _both(p, q, normalize=True):
    """``(numpy build, torch build)`` of the same rows, sorted alike (ties keep one order)."""
    assert _router.numpy_sums(p)
    fast = Breakpoints.build(p, q, validate=False, normalize=normalize)
    vocab = p.shape[-1]
    p2, q2 = p.reshape(-1, vocab), q.reshape(-1, vocab)
    r = _sums.neutral_ratios(torch.div(p2, q2))
    ref = Breakpoints(*_sums._sort_rows(r, p2, q2), p.shape[:-1], p.dtype, normalize=normalize, namespace=TORCH)
    assert fast.backend == "numpy" and ref.backend == "torch"
    return fast, ref


def _close(x, y, tol=1e-12):
    """Equal to ``tol``, relatively for large values (``a = r - 1`` grows with the ratio)."""
    assert x.dtype == y.dtype and x.shape == y.shape
    if x.is_floating_point():
        torch.testing.assert_close(x, y, atol=tol, rtol=tol, equal_nan=True)
    else:
        assert torch.equal(x, y)


def _queries(bp, rows, name):
    """``[(a, b, acceptance, D_f or None)]`` for each query kind; ``curve()`` as [..., 2V + 1] points."""
    budget = BUDGETS.repeat(rows // len(BUDGETS) + 1)[:rows].reshape(bp.batch_shape)
    acc = torch.linspace(0, 1, rows, dtype=torch.float64).reshape(bp.batch_shape)
    point, value = bp.for_divergence_with_value(budget, name)
    dual = bp.for_acceptance(acc)
    out = [(*point, value), (*dual, bp.divergence_at(dual.acceptance, name)),
           (*bp.for_divergence_bound(budget, name), None)]
    return out + [(*bp.curve(), None)] if bp.vocab <= 300 else out  # the curve: 2V + 1 points per row


def _same_answers(fast, ref, p, q, tol=1e-12):
    """Equal acceptance and D_f, and the same clamp distribution ``pi(a, b)`` to ``tol`` in mass.

    ``(a, b)`` themselves are compared through ``pi``: where ``q(A)`` is tiny (ratios far above 1) an
    ulp of mass is a huge change of ``a`` (docs/theory.md, section 9), not of ``pi``.
    """
    for (a, b, acc, value), (a_r, b_r, acc_r, value_r) in zip(fast, ref):
        _close(acc, acc_r, tol)
        if value is not None:
            _close(value, value_r, tol)
        extra = (1,) * (a.ndim - p.ndim + 1)  # the curve's point axis
        pp, qq = (x.reshape(x.shape[:-1] + extra + x.shape[-1:]).double() for x in (p, q))
        pi, pi_r = (torch.maximum((1 - y.unsqueeze(-1)) * qq, torch.minimum(pp, (1 + x.unsqueeze(-1)) * qq))
                    for x, y in ((a, b), (a_r, b_r)))
        _close(torch.nan_to_num(pi - pi_r).abs().sum(-1), torch.zeros_like(pi[..., 0]), tol)


@pytest.mark.parametrize("n,peaked", [(2, False), (3, True), (50, False), (257, True), (1000, False), (4096, True)])
def test_numpy_build_equals_torch_build(n, peaked):
    p, q = dirichlet_pairs(12, n, n, alpha=0.05 if peaked else 0.7, equal_row=True)
    fast, ref = _both(p, q)
    for field in FIELDS:
        _close(getattr(fast.arrays(), field), getattr(ref.arrays(), field))
    for name in sorted(GENERATORS):
        _close(fast.prefix(GENERATORS[name]), ref.prefix(GENERATORS[name]))
        _same_answers(_queries(fast, 12, name), _queries(ref, 12, name), p, q)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_solve_on_small_rows_equals_the_torch_build(name):
    """``solve`` (single rows and a batch, primal and dual) is unchanged by the numpy build."""
    p, q = dirichlet_pairs(6, 300, 7, alpha=0.3, equal_row=True)
    for args in ((p, q), (p[3], q[3])):
        for kwargs in ({"max_divergence": 0.05}, {"min_acceptance": 0.9}):
            fast = solve(*args, divergence=name, **kwargs)
            ref = _solve(*args, divergence=name, route=_router.SORTED, namespace=TORCH, **kwargs)
            for field in ("acceptance", "achieved_divergence", "sd_acceptance"):
                _close(getattr(fast, field), getattr(ref, field))
            _same_answers([(fast.a, fast.b, fast.acceptance, None)], [(ref.a, ref.b, ref.acceptance, None)],
                          *args)


def test_float32_rows_with_overflowing_ratios():
    """A ratio ``p_i / q_i`` beyond float32's range counts as ``q_i = 0`` in both builds."""
    rng = np.random.default_rng(5)
    p = torch.from_numpy(rng.dirichlet([0.5] * 64, size=4)).float()
    q = torch.from_numpy(rng.dirichlet([0.5] * 64, size=4)).float()
    q[:, 0], p[:, 0] = 1e-40, 0.2  # subnormal q: p / q overflows float32
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    fast, ref = _both(p, q)
    assert bool(torch.isinf(fast.arrays().ratio[:, -1]).all()) and bool((fast.arrays().q[:, -1] == 0).all())
    for field in FIELDS:
        _close(getattr(fast.arrays(), field), getattr(ref.arrays(), field))
    _same_answers(_queries(fast, 4, "kl"), _queries(ref, 4, "kl"), p, q, tol=1e-6)


def test_rows_off_the_sum_are_rescaled_alike():
    """Rows within the sum tolerance but not summing to 1 are rescaled the same way in both builds."""
    p, q = dirichlet_pairs(4, 100, 3, alpha=0.5)
    p, q = p * (1 + 1e-9), q * (1 - 1e-9)
    fast, ref = _both(p, q)
    assert fast.normalized and ref.normalized
    for field in FIELDS:
        _close(getattr(fast.arrays(), field), getattr(ref.arrays(), field))
    _same_answers(_queries(fast, 4, "hellinger"), _queries(ref, 4, "hellinger"), p, q)
