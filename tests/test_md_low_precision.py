"""Low-precision outputs of the core (``docs/theory.md``, section 9, "Low precision").

The solvers compute in float64; a float32 point ``(a, b)`` is rounded towards ``pi = q``
(:func:`mdboost.md.clamp.point_to_dtype`), so that ``pi`` at the returned values keeps the budget;
``verify``'s overlaps are of the rows as solved. References: the float64 solve, and
``D_f(pi(a, b) || q)`` recomputed in float64 on the rescaled rows.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mdboost.md import _router
from mdboost.md.clamp import point_to_dtype
from mdboost.md.divergences import f_divergence, resolve
from mdboost.md.solve import _solve, mentored_distribution, solve
from mdboost.md.verify import verify

P = [1.0, 0.0]
Q = [0.97582394, 0.02417603]  # float32: the rkl optimum at 0.6 has b = 1 - 6.2e-12


def _kept(p, q, sol, div):  # D_f(pi(a, b) || q) on the rows as solved, pi in float64 at the returned (a, b)
    p64, q64 = p.double(), q.double()
    p64, q64 = p64 / p64.sum(-1, keepdim=True), q64 / q64.sum(-1, keepdim=True)
    pi = mentored_distribution(p64, q64, sol.a.double(), sol.b.double(), validate=False)
    return f_divergence(pi, q64, div, validate=False)


@pytest.mark.parametrize("route", [r for r in _router.ROUTES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("div", ["rkl", "neyman", "alpha:-3"])
def test_a_float32_point_next_to_b_1_keeps_the_budget_on_every_route(route, dtype, div):
    p, q = torch.tensor(P, dtype=dtype), torch.tensor(Q, dtype=dtype)
    one_row = route in (_router.SCALAR_ROW, _router.BUCKETED_ROW)
    if one_row and resolve(div).g_float is None:  # the one-row routes search in Python floats
        with pytest.raises(ValueError, match="Python-float form"):
            _solve(p, q, max_divergence=0.6, divergence=div, route=route)
        return
    if route == _router.SCALAR_ROW and dtype == torch.float16:  # the router never picks it for half rows
        with pytest.raises(ValueError, match="float32 or float64 rows"):
            _solve(p, q, max_divergence=0.6, divergence=div, route=route)
        return
    sol = _solve(p, q, max_divergence=0.6, divergence=div, route=route)
    q64 = q.double() / q.double().sum()  # half's q sums to 0.99976: the rows as solved
    ref = solve(p.double(), q64, max_divergence=0.6, divergence=div)
    assert sol.b.dtype == torch.float32 and float(sol.b) < 1.0  # rounded to nearest it was 1.0: pi_2 = 0
    assert float(_kept(p, q, sol, div)) <= 0.6 * (1 + 1e-5)
    assert float(sol.b) <= float(ref.b) + 1e-6 and float(sol.a) <= float(ref.a) + 1e-6  # never past float64's
    assert abs(float(sol.acceptance) - float(ref.acceptance)) <= 1e-5


def test_the_breakpoints_queries_and_the_curve_round_towards_q():
    from mdboost.md.breakpoints import Breakpoints

    p, q = torch.tensor(P), torch.tensor(Q)
    bp = Breakpoints.build(p, q)
    point, value = bp.for_divergence_with_value(0.6, "rkl")
    for pt in (bp.for_divergence(0.6, "rkl"), bp.for_divergence_bound(0.6, "rkl"), point):
        assert float(pt.b) < 1.0
    ref = Breakpoints.build(p.double(), q.double()).curve()
    cp = bp.curve()
    valid = ~torch.isnan(cp.a)
    assert torch.equal(valid, ~torch.isnan(ref.a))
    assert (cp.a[valid].double() <= ref.a[valid]).all() and (cp.b[valid].double() <= ref.b[valid]).all()


@settings(max_examples=60, deadline=None)
@given(a=st.floats(0.0, 1e39, allow_subnormal=True), b=st.floats(0.0, 1.0, allow_subnormal=True))
def test_point_to_dtype_rounds_each_towards_zero_by_less_than_an_ulp(a, b):
    a64, b64 = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    a32, b32 = point_to_dtype(a64, b64, torch.float32)
    assert a32.dtype == b32.dtype == torch.float32
    for x64, x32 in ((a64, a32), (b64, b32)):
        assert float(x32) <= float(x64)
        if float(x64) <= torch.finfo(torch.float32).max:
            assert float(torch.nextafter(x32, torch.tensor(math.inf))) >= float(x64)  # the next float32 is past it
        else:  # beyond float32: its largest value (what mentored_distribution reads a as)
            assert float(x32) == torch.finfo(torch.float32).max


def test_point_to_dtype_keeps_nan_inf_and_float64():
    nan_inf = torch.tensor([math.nan, math.inf, 0.0], dtype=torch.float64)
    a32, b32 = point_to_dtype(nan_inf, torch.zeros(3, dtype=torch.float64), torch.float32)
    assert math.isnan(float(a32[0])) and a32[1] == math.inf and a32[2] == 0 and (b32 == 0).all()
    a, b = torch.rand(4, dtype=torch.float64), torch.rand(4, dtype=torch.float64)
    assert point_to_dtype(a, b, torch.float64)[0] is a


@pytest.mark.parametrize("div", ["kl", "rkl", "hellinger", "neyman", "alpha:-3"])
def test_rounded_points_never_raise_the_divergence_of_float64_points(div):
    """The property behind the rounding: each pi_i moves towards q_i, so D_f at the float32 point
    is at most D_f at the float64 point (both evaluated in float64 on the same rows)."""
    gen = torch.Generator().manual_seed(7)
    p = torch.softmax(4 * torch.randn(64, 50, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(4 * torch.randn(64, 50, generator=gen, dtype=torch.float64), -1)
    sol = solve(p, q, max_divergence=torch.rand(64, generator=gen, dtype=torch.float64), divergence=div)
    a32, b32 = point_to_dtype(sol.a, sol.b, torch.float32)
    d64 = f_divergence(mentored_distribution(p, q, sol.a, sol.b, validate=False), q, div, validate=False)
    d32 = f_divergence(mentored_distribution(p, q, a32.double(), b32.double(), validate=False), q, div, validate=False)
    assert (d32 <= d64 + 1e-7).all()  # + the mass moved by an ulp (1e-7 of a raw f's f'(1) (sum - 1) term)


def test_verify_overlaps_are_of_the_rows_as_solved():
    """Two equal float16 rows summing to 1.0005 (valid: within 1e-2) overlapped by 1.0005."""
    row = torch.tensor([0.3335, 0.3335, 0.3335], dtype=torch.float16)
    assert float(row.double().sum()) > 1.0004
    p, q, tokens = row.expand(1, 1, 3).clone(), row.expand(1, 2, 3).clone(), torch.tensor([[1]])
    for kwargs in (dict(), dict(max_divergence=0.2, divergence="rkl"), dict(min_acceptance=0.9)):
        res = verify(tokens, p, q, generator=torch.Generator().manual_seed(0), **kwargs)
        assert float(res.sd_acceptance) == 1.0 and float(res.acceptance_probability) == 1.0
    res = verify(tokens, p, q, mentored_probs=p.clone())  # towards an explicit pi
    assert float(res.sd_acceptance) == 1.0 and float(res.acceptance_probability) == 1.0


def test_verify_sd_acceptance_is_one_minus_tv_of_the_rescaled_rows():
    gen = torch.Generator().manual_seed(3)
    p64 = torch.softmax(torch.randn(4, 3, 40, generator=gen, dtype=torch.float64), -1)
    q64 = torch.softmax(torch.randn(4, 4, 40, generator=gen, dtype=torch.float64), -1)
    p, q = p64.half(), q64.half()  # rows off 1 by half's rounding
    tokens = torch.multinomial(p64.reshape(-1, 40), 1, generator=gen).reshape(4, 3)
    res = verify(tokens, p, q, max_divergence=0.1, generator=gen)
    ps, qs = p.double(), q[:, :3].double()
    want = torch.minimum(ps / ps.sum(-1, keepdim=True), qs / qs.sum(-1, keepdim=True)).sum(-1)
    assert (res.sd_acceptance.double() - want).abs().max() <= 1e-6
    raw = verify(tokens, p.float(), q.float(), generator=gen, validate=False)  # trusted rows: as given
    assert (raw.sd_acceptance.double() - torch.minimum(p.double(), qs).sum(-1)).abs().max() <= 1e-6
