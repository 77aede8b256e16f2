"""Few small CPU rows search in Python floats (``mdboost.md._scalar``): the same point as the array search.

``mdboost.md._search.primal_point`` takes the scalar search for up to ``_router.SCALAR_ROWS`` rows
(:func:`mdboost.md._router.scalar_search`); with ``scalar=False`` the same row goes through the array
search of the namespace tests. Both must give the same excess mass ``m`` (so the same acceptance), the same
``D_f`` at the point, and keep ``D_f <= budget``, for every built-in generator with a scalar twin.
"""

import math

import pytest
import torch

from mdboost.md import _router, _search
from mdboost.md._xp import NUMPY, TORCH
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import GENERATORS, alpha, resolve
from mdboost.md.divergences import f_divergence
from mdboost.md.solve import mentored_distribution, solve
from tests._md_pairs import RESCUE_P, RESCUE_Q, dirichlet_pairs

BUDGETS = (0.0, 1e-9, 1e-4, 0.01, 0.1, 1.0, 10.0, math.inf)


def _both(bp, budget, div):
    col = torch.tensor([[budget]], dtype=torch.float64)
    fast = _search.primal_point(bp, col, div, False, with_value=True)
    ref = _search.primal_point(bp, col, div, False, with_value=True, scalar=False)
    return fast, ref


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("n,peaked", [(2, False), (3, True), (50, False), (257, True), (2000, False)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_scalar_row_equals_array_search(name, n, peaked, dtype):
    div = GENERATORS[name]
    assert div.g_float is not None
    p, q = dirichlet_pairs(3, n, n + len(name), alpha=0.05 if peaked else 0.7, equal_row=True)
    for i in range(3):
        bp = Breakpoints.build(p[i:i + 1].to(dtype), q[i:i + 1].to(dtype))
        for budget in BUDGETS:
            (a, b, m, value), (a0, b0, m0, value0) = _both(bp, budget, div)
            torch.testing.assert_close(m, m0, atol=1e-11, rtol=0)  # the acceptance is 1 - m
            if 0 < budget < math.inf:
                assert float(value) <= budget * (1 + 1e-12)  # the kept side fits
            if float(value0) < 1e3:  # D_f of the extreme peaked rows is ill-conditioned in m
                torch.testing.assert_close(value, value0, atol=1e-9, rtol=1e-7)
            # (a, b) agree in mass: pi differs by less than the tolerance of m
            q_s, r_s = bp.arrays().q, bp.arrays().ratio
            pi = torch.maximum((1 - b) * q_s, torch.minimum(r_s * q_s, (1 + a) * q_s))
            pi0 = torch.maximum((1 - b0) * q_s, torch.minimum(r_s * q_s, (1 + a0) * q_s))
            assert float(torch.nan_to_num(pi - pi0).abs().sum()) <= 1e-9


def test_scalar_generators_equal_the_torch_generators():
    z = [0.0, 1e-300, 1e-8, 0.3, 1.0, 1.7, 1e8, 1e300, math.inf]
    for name in sorted(GENERATORS):
        div = GENERATORS[name]
        g = div.g_float
        ref = div.g(torch.tensor(z, dtype=torch.float64)).tolist()
        for x, want in zip(z, ref):
            got = g(x)
            assert (got == want) or math.isclose(got, want, rel_tol=1e-14, abs_tol=1e-300), (name, x, got, want)


def test_generators_without_a_twin_take_the_array_search():
    assert alpha(0.5).g_float is None
    assert resolve(lambda z: (z - 1.0) ** 2).g_float is None


def test_few_rows_take_the_scalar_search_and_more_the_array_search():
    rows = _router.SCALAR_ROWS
    assert _router.scalar_search(rows, 100, False, NUMPY)  # row by row in Python floats
    assert not _router.scalar_search(rows + 1, 100, False, NUMPY)  # one row more: the array search
    assert not _router.scalar_search(rows, 100, True, NUMPY)  # the bound mode
    assert not _router.scalar_search(rows, 100, False, TORCH)
    assert not _router.scalar_search(rows, _router.SMALL_VOCAB + 1, False, NUMPY)
    p, q = dirichlet_pairs(rows + 1, 100, 5, alpha=0.7)
    few = solve(p[:rows], q[:rows], max_divergence=0.05)
    more = solve(p, q, max_divergence=0.05)
    torch.testing.assert_close(few.acceptance, more.acceptance[:-1], atol=1e-11, rtol=0)
    torch.testing.assert_close(few.achieved_divergence, more.achieved_divergence[:-1], atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("name", ["kl", "rkl", "hellinger", "tv"])
def test_a_few_rows_equal_their_rows_solved_alone_exactly(name):
    """Each row of a batch of few rows is searched alone: the same floats as that row as a batch of one."""
    p, q = dirichlet_pairs(_router.SCALAR_ROWS, 300, 9, alpha=0.3)
    budgets = torch.tensor([1e-6, 1e-3, 0.02, 0.1, 0.5, 2.0, 10.0, math.inf] * 2, dtype=torch.float64)[:p.shape[0]]
    batch = solve(p, q, max_divergence=budgets, divergence=name)
    for i in range(p.shape[0]):
        one = solve(p[i:i + 1], q[i:i + 1], max_divergence=budgets[i:i + 1], divergence=name)
        for field in ("a", "b", "acceptance", "achieved_divergence"):
            assert bool(getattr(batch, field)[i] == getattr(one, field)[0]), (field, i)


def _overflow_row(dtype):
    """A float32 row whose ratio p_i / q_i overflows (q_i counts as 0) and a row with zeros in q."""
    p = torch.tensor([0.3, 0.3, 0.2, 0.2, 0.0], dtype=torch.float64)
    q = torch.tensor([0.5, 1e-39, 0.25, 0.25 - 1e-39, 0.0], dtype=torch.float64)
    return p.to(dtype), q.to(dtype)


def _rows():
    for n, peaked in [(2, False), (3, True), (50, False), (257, True), (2000, False)]:
        p, q = dirichlet_pairs(3, n, 7 * n + peaked, alpha=0.05 if peaked else 0.7, equal_row=n > 2)
        for dtype in (torch.float64, torch.float32):
            for i in range(3):
                yield p[i].to(dtype), q[i].to(dtype)
    for dtype in (torch.float64, torch.float32):
        yield _overflow_row(dtype)
        yield torch.tensor([0.5, 0.5], dtype=dtype), torch.tensor([1.0, 0.0], dtype=dtype)
        yield torch.tensor([1.0], dtype=dtype), torch.tensor([1.0], dtype=dtype)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_one_row_solve_equals_the_batched_path_exactly(name):
    """``solve`` on a 1-D row (``_scalar_rows.solve_row``: its own sums) gives the same floats as the same
    row as a batch of one (``Breakpoints`` and the search), with and without validation."""
    for p, q in _rows():
        for budget in BUDGETS:
            for validate in (True, False):
                one = solve(p, q, max_divergence=budget, divergence=name, validate=validate)
                ref = solve(p[None], q[None], max_divergence=budget, divergence=name, validate=validate)
                for field in ("a", "b", "acceptance", "achieved_divergence", "sd_acceptance", "off_support", "feasible"):
                    x, y = getattr(one, field), getattr(ref, field)[0]
                    assert x.shape == () and x.dtype == y.dtype, field
                    assert bool(x == y), (field, p.shape, p.dtype, budget, validate, float(x), float(y))


def test_one_row_solve_takes_the_row_path():
    p, q = dirichlet_pairs(2, 100, 5, alpha=0.7)
    assert _router.pick(p[0], q[0], 0.05, True) == _router.SCALAR_ROW
    assert _router.pick(p[0], q[0], 0.05, False) == _router.SORTED  # no scalar twin (alpha(0.5))
    assert _router.pick(p[0], q[0], None, True) == _router.SORTED  # a tensor budget, a dual, support="any"
    assert _router.pick(p[0], q[0], 0.0, True) == _router.SORTED  # a budget at the noise level
    assert _router.pick(p, q, 0.05, True) == _router.SORTED  # a batch
    assert _router.pick(p[0].float(), q[0], 0.05, True) == _router.SORTED  # mixed dtypes
    assert _router.pick(p[0], q[0], 0.05, True, "bound") == _router.SORTED
    assert alpha(0.5).g_float is None and resolve("kl").g_float is not None
    ref = solve(p[0][None], q[0][None], max_divergence=0.05)
    for budget in (0.05, torch.tensor(0.05, dtype=torch.float64)):  # a Python float, a tensor: the same floats
        assert bool(solve(p[0], q[0], max_divergence=budget).acceptance == ref.acceptance[0])


@pytest.mark.parametrize("p,q,budget", [
    ([0.5, float("nan")], [0.5, 0.5], 0.1),
    ([0.5, 0.5], [1.5, -0.5], 0.1),
    ([0.5, 0.6], [0.5, 0.5], 0.1),
    ([0.5, 0.5], [0.5, float("inf")], 0.1),
    ([0.5, 0.5], [0.5, 0.5], -1.0),
    ([0.5, 0.5], [0.5, 0.5], float("nan")),
])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_row_solve_raises_the_errors_of_the_general_path(p, q, budget, dtype):
    p, q = torch.tensor(p, dtype=dtype), torch.tensor(q, dtype=dtype)
    with pytest.raises(ValueError) as one:
        solve(p, q, max_divergence=budget)
    with pytest.raises(ValueError) as ref:
        solve(p[None], q[None], max_divergence=budget)
    assert str(one.value) == str(ref.value)


def test_a_budget_at_the_rounding_of_the_divergence_takes_the_array_search():
    """At D = 6e-17 the row's ``D_f - budget`` is within its float64 rounding: the Python-float
    secant path came out 1.2e-8 of acceptance short of the bound mode's (a fuzz case); such
    budgets take the array search, which is at least the bound mode's there."""
    from mdboost.md.solve import solve

    p = torch.tensor([[0.014471228469469048, 9.588757294622285e-24, 0.985528771530472, 5.897504794016364e-14]],
                     dtype=torch.float64)
    q = torch.tensor([[0.1693977143382682, 0.5581831599275944, 0.27241912573413746, 0.0]], dtype=torch.float64)
    budget = 6.422339998779586e-17
    assert budget < _router.NOISE_BUDGET
    for pp, qq in ((p, q), (p[0], q[0])):  # the batch-of-one route and the 1-D row route
        exact = solve(pp, qq, max_divergence=budget, divergence="js")
        bound = solve(pp, qq, max_divergence=budget, divergence="js", mode="bound")
        assert float(exact.acceptance) >= float(bound.acceptance) - 1e-12
        assert float(exact.achieved_divergence) <= budget * (1 + 1e-6) + 1e-15





def test_rows_the_array_search_loses_to_rounding_are_solved_by_the_scalar_search():
    p1 = torch.tensor(RESCUE_P, dtype=torch.float64)
    q1 = torch.tensor(RESCUE_Q, dtype=torch.float64)
    p = torch.stack([p1, torch.full_like(p1, 1 / 16)])  # two rows: the array search
    q = torch.stack([q1, torch.softmax(torch.arange(16, dtype=torch.float64) / 4, -1)])
    budget = 15.417473254491748
    batch = solve(p, q, max_divergence=budget, divergence="pearson")
    bound = solve(p, q, max_divergence=budget, divergence="pearson", mode="bound")
    one = solve(p1, q1, max_divergence=budget, divergence="pearson")
    assert float(batch.acceptance[0]) > 0.98 > float(batch.sd_acceptance[0])  # not the curve's start
    assert float(batch.acceptance[0]) == float(one.acceptance)
    assert bool((batch.acceptance >= bound.acceptance - 1e-12).all())
    assert 0 < float(batch.achieved_divergence[0]) <= budget
    pi = mentored_distribution(p1, q1, batch.a[0], batch.b[0])
    assert abs(float(pi.sum()) - 1) < 1e-9
    assert abs(float(f_divergence(pi, q1, "pearson")) - float(batch.achieved_divergence[0])) < 1e-9


# A fuzz case (float64, neyman, seed 5): ratios up to 1.4e282, where (z - 1)^2 alone overflows
# although g(z) = (z - 1)^2 / z (about z) is finite, so D_f at the curve's end read inf and both
# exact searches returned the curve's start (acceptance 0.92) below the bound mode's 0.9995.
_NEYMAN_P = [3.078841435283305e-11, 0.0005133678441577196, 0.07788289674783588, 2.1328639669260042e-09,
             2.1176544283049892e-16, 0.9216037331622859, 8.206788199772695e-11]
_NEYMAN_Q = [7.6e-322, 1.5371499327880813e-28, 4.611449798364243e-12, 4.611449798364243e-12,
             1.5371499327880813e-298, 0.9999999999907772, 1.5371499327880813e-28]


def test_neyman_at_ratios_beyond_the_square_s_range_reaches_the_curve_s_end():
    z = torch.tensor([1e154, 1e200, 1.3e282, 1.7e308], dtype=torch.float64)
    g = GENERATORS["neyman"].g(z)
    exact = z - 2 + 1 / z  # (z - 1)^2 / z expanded; rounds to z here
    assert torch.equal(g, exact) and [GENERATORS["neyman"].g_float(float(x)) for x in z] == g.tolist()
    p, q = torch.tensor(_NEYMAN_P, dtype=torch.float64), torch.tensor(_NEYMAN_Q, dtype=torch.float64)
    budget = 0.28298881995329983
    for rows in (p[None], torch.stack([p, torch.full_like(p, 1 / 7)])):  # the scalar and the array search
        qs = q[None] if rows.shape[0] == 1 else torch.stack([q, torch.softmax(torch.arange(7.0, dtype=torch.float64), -1)])
        exact_sol = solve(rows, qs, max_divergence=budget, divergence="neyman")
        bound = solve(rows, qs, max_divergence=budget, divergence="neyman", mode="bound")
        assert float(exact_sol.acceptance[0]) >= float(bound.acceptance[0]) > 0.999  # not the curve's start (0.92)
        # D_f at the curve's end (about 0.085) fits the budget: the optimum is the end, acceptance 1 - p(q = 0)
        assert float(exact_sol.acceptance[0]) == pytest.approx(float(Breakpoints.build(p, q).max_acceptance), abs=1e-15)
        pi = mentored_distribution(p, q, exact_sol.a[0], exact_sol.b[0])
        assert 0 < float(f_divergence(pi, q, "neyman")) <= budget
