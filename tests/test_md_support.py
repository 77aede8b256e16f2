"""``solve(..., support="any")``: the f-MD optimum over all distributions, against brute force.

The references are independent of :mod:`mdboost.md.support`: the numpy generators of
``tests/test_md_reference.py`` with the limit convention ``q f(pi / q) = pi lim f(z) / z`` at
``q = 0``, an exhaustive grid over the simplex (n = 3), a scalar root (n = 2) and scipy SLSQP.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq, minimize

from mdboost.md.divergences import resolve
from mdboost.md.solve import acceptance_probability, mentored_distribution, solve
from mdboost.md.support import zero_cost
from tests import test_md_reference as reference

REF = dict(reference.REF, **{"alpha:0.5": reference._alpha(0.5)})
NAMES = list(REF)
FINITE = [name for name in NAMES if math.isfinite(zero_cost(resolve(name)))]
T64 = dict(dtype=torch.float64)


def ref_divergence(pi, q, name):
    """The reference ``D_f(pi || q)`` (``tests/test_md_reference.py``), with ``alpha:0.5`` added."""
    f, slope = REF[name]
    pi, q = np.asarray(pi, np.float64), np.asarray(q, np.float64)
    pos = q > 0
    terms = np.where(pos, q * f(np.where(pos, pi / np.where(pos, q, 1.0), 1.0)), 0.0)
    with np.errstate(invalid="ignore"):
        return float(terms.sum() + np.where(~pos & (pi > 0), pi * slope, 0.0).sum())


def _t(x):
    return torch.as_tensor(np.asarray(x), **T64)


def _pi(sol, p, q):
    """The distribution of a solution, explicitly (numpy)."""
    pi = mentored_distribution(_t(p), _t(q), sol.a, sol.b, off_support=sol.off_support, validate=False)
    return pi.numpy()


def test_zero_cost_is_the_asymptotic_slope_of_g():
    assert set(FINITE) == {"rkl", "hellinger", "neyman", "tv", "js", "alpha:-1.5", "alpha:0.5"}
    for name in FINITE:
        div = resolve(name)
        f, _ = REF[name]
        z = 1e14
        shift = div.fprime_one if div.standardize else 0.0
        slope = (f(z) - shift * (z - 1)) / z  # g(z) / z from the reference generator
        assert zero_cost(div) == pytest.approx(float(slope), rel=1e-2 if name == "alpha:0.5" else 1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_two_tokens_match_the_scalar_root(name):
    """p = [.5, .5], q = [1, 0]: pi = [1 - z, z]; the optimum is the largest z within the budget."""
    p, q = np.array([0.5, 0.5]), np.array([1.0, 0.0])
    for budget in (0.01, 0.1026, 0.3):
        sol = solve(_t(p), _t(q), max_divergence=budget, divergence=name, support="any")
        d = lambda z: ref_divergence([1 - z, z], q, name) - budget  # noqa: E731
        z = 0.0 if not d(1e-15) < 0 else 0.5 if d(0.5) <= 0 else brentq(d, 1e-15, 0.5, xtol=1e-14)
        assert float(sol.acceptance) == pytest.approx(0.5 + z, abs=1e-9), (name, budget)
        assert float(sol.off_support) == pytest.approx(z, abs=1e-9)
        target = solve(_t(p), _t(q), max_divergence=budget, divergence=name)
        assert float(target.acceptance) == pytest.approx(0.5, abs=1e-12)
    if name == "hellinger":  # pi = [.9, .1]: D = 0.10263, acceptance 0.6 (0.5 on the target's support)
        d = ref_divergence([0.9, 0.1], q, name)
        hel = solve(_t(p), _t(q), max_divergence=d, divergence=name, support="any")
        assert float(hel.acceptance) == pytest.approx(0.6, abs=1e-9)


def _grid(n_steps):
    """Every pi of the 3-simplex on a grid of step 1 / n_steps, [G, 3]."""
    i, j = np.meshgrid(np.arange(n_steps + 1), np.arange(n_steps + 1), indexing="ij")
    keep = i + j <= n_steps
    i, j = i[keep], j[keep]
    return np.stack([i, j, n_steps - i - j], axis=-1) / n_steps


def _grid_divergence(pis, q, name):
    f, slope = REF[name]
    pos = q > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        inside = np.where(pos, q * f(pis / np.where(pos, q, 1.0)), 0.0)
        outside = np.where(~pos & (pis > 0), pis * slope, 0.0)
    return (inside + outside).sum(-1)


GRID = _grid(600)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", NAMES)
def test_any_support_matches_grid_search(name, seed):
    """n = 3 with a zero in q: no grid point beats the solution, and the best one comes close."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(3))
    q = np.append(rng.dirichlet(np.ones(2)), 0.0)[rng.permutation(3)]
    d_grid = _grid_divergence(GRID, q, name)
    acc_grid = np.minimum(GRID, p).sum(-1)
    budgets = [0.02, 0.1, 0.4, 1.5]
    sol = solve(_t(p).expand(4, 3), _t(q).expand(4, 3), max_divergence=_t(budgets), divergence=name,
                support="any")
    target = solve(_t(p).expand(4, 3), _t(q).expand(4, 3), max_divergence=_t(budgets), divergence=name)
    pis = _pi(sol, np.broadcast_to(p, (4, 3)), np.broadcast_to(q, (4, 3)))
    for i, budget in enumerate(budgets):
        best = acc_grid[d_grid <= budget].max()
        ours = float(sol.acceptance[i])
        assert ours >= best - 1e-9, (name, budget)
        assert ours <= best + 5e-3, (name, budget)
        assert ref_divergence(pis[i], q, name) <= budget * (1 + 1e-9) + 1e-12  # attained
        assert float(np.minimum(pis[i], p).sum()) == pytest.approx(ours, abs=1e-9)
        assert pis[i].sum() == pytest.approx(1.0, abs=1e-9)
        assert float(sol.achieved_divergence[i]) == pytest.approx(ref_divergence(pis[i], q, name), abs=1e-9)
    if name not in FINITE:  # mass where q = 0 costs infinitely much: the same optimum
        assert torch.equal(sol.acceptance, target.acceptance) and not sol.off_support.any()
    else:
        assert (sol.acceptance >= target.acceptance - 1e-12).all()
        assert float((sol.acceptance - target.acceptance).max()) > 1e-3  # the large budgets leave the support


@pytest.mark.parametrize("name", FINITE + ["kl"])
def test_any_support_dual_matches_grid_search(name):
    rng = np.random.default_rng(4)
    p = rng.dirichlet(np.ones(3))
    q = np.array([0.3, 0.7, 0.0])
    targets = [1 - p[2] / 2, 1 - p[2] / 5, 1 - p[2] / 20]  # all above the support's maximum 1 - p(q = 0)
    sol = solve(_t(p).expand(3, 3), _t(q).expand(3, 3), min_acceptance=_t(targets), divergence=name,
                support="any")
    d_grid = _grid_divergence(GRID, q, name)
    acc_grid = np.minimum(GRID, p).sum(-1)
    for i, target in enumerate(targets):
        if name == "kl":
            assert not bool(sol.feasible[i]) and float(sol.acceptance[i]) == pytest.approx(1 - p[2], abs=1e-12)
            continue
        assert bool(sol.feasible[i]) and float(sol.acceptance[i]) == pytest.approx(target, abs=1e-12)
        best = d_grid[acc_grid >= target].min()
        ours = float(sol.achieved_divergence[i])
        assert ours <= best + 1e-9
        assert ours >= best - 2e-2 * max(best, 1e-3)
    if name != "kl":  # the dual is f-independent on the extension as on the curve
        ref = solve(_t(p).expand(3, 3), _t(q).expand(3, 3), min_acceptance=_t(targets), divergence="tv",
                    support="any")
        for x, y in ((sol.a, ref.a), (sol.b, ref.b), (sol.off_support, ref.off_support)):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-12)


def _slsqp(p, q, budget, name, rng, starts=6):
    n = len(p)
    cons = [
        {"type": "eq", "fun": lambda x: x[:n].sum() - 1},
        {"type": "ineq", "fun": lambda x: budget - ref_divergence(np.maximum(x[:n], 1e-300), q, name)},
        {"type": "ineq", "fun": lambda x: x[:n] - x[n:]},
        {"type": "ineq", "fun": lambda x: p - x[n:]},
    ]
    for _ in range(starts):
        pi0 = rng.dirichlet(np.ones(n))
        x0 = np.concatenate([pi0, np.minimum(pi0, p) * 0.5])
        res = minimize(lambda x: -x[n:].sum(), x0, method="SLSQP", constraints=cons,
                       bounds=[(1e-12, 1)] * n + [(0, 1)] * n, options={"maxiter": 300, "ftol": 1e-12})
        pi = np.clip(res.x[:n], 0, None)
        pi = pi / pi.sum()
        yield float(np.minimum(pi, p).sum()), ref_divergence(pi, q, name)


@pytest.mark.parametrize("name", FINITE)
@pytest.mark.parametrize("seed", range(2))
def test_slsqp_never_beats_any_support(name, seed):
    """n in 4..6, two zeros in q: SLSQP from many starts never finds a better point.

    (With an infinite zero cost every SLSQP point off the support has an infinite divergence:
    ``kl`` is covered by the grid search, where grid points on the support exist.)
    """
    rng = np.random.default_rng(50 + seed)
    n = int(rng.integers(4, 7))
    p = rng.dirichlet(np.ones(n))
    q = rng.dirichlet(np.ones(n))
    q[rng.choice(n, 2, replace=False)] = 0.0
    q /= q.sum()
    for budget in (0.05, 0.5):
        for acc, d in _slsqp(p, q, budget, name, rng):
            ours = solve(_t(p), _t(q), max_divergence=max(d, budget), divergence=name, support="any")
            assert acc <= float(ours.acceptance) + 1e-7, (name, budget)


def test_tv_formula_with_zeros():
    rng = np.random.default_rng(9)
    p = rng.dirichlet(np.ones(30), size=6)
    q = rng.dirichlet(np.ones(30), size=6)
    q[:, :5] = 0.0
    q /= q.sum(-1, keepdims=True)
    tv, p_zero = 0.5 * np.abs(p - q).sum(-1), p[:, :5].sum(-1)
    budgets = np.array([0.0, 0.05, 0.2, 0.4, 0.7, 1.0])
    target = solve(_t(p), _t(q), max_divergence=_t(budgets), divergence="tv")
    anywhere = solve(_t(p), _t(q), max_divergence=_t(budgets), divergence="tv", support="any")
    np.testing.assert_allclose(target.acceptance.numpy(), np.minimum(1 - p_zero, 1 - tv + budgets), atol=1e-10)
    np.testing.assert_allclose(anywhere.acceptance.numpy(), np.minimum(1, 1 - tv + budgets), atol=1e-10)
    assert (anywhere.achieved_divergence.numpy() <= budgets + 1e-12).all()


@pytest.mark.parametrize("name", FINITE)
def test_continuity_as_the_zero_becomes_tiny(name):
    """q's zero -> eps: the default solution at eps tends to support="any" at 0 (the default jumps at 0)."""
    p = _t([0.3, 0.5, 0.2])
    q0 = _t([0.6, 0.4, 0.0])
    d_end = float(solve(p, q0, max_divergence=float("inf"), divergence=name).achieved_divergence)
    budget = (d_end + ref_divergence(p.numpy(), q0.numpy(), name)) / 2  # inside the extension
    anywhere = float(solve(p, q0, max_divergence=budget, divergence=name, support="any").acceptance)
    jump = anywhere - float(solve(p, q0, max_divergence=budget, divergence=name).acceptance)
    assert jump > 0.02 and anywhere < 1  # inside the extension, not at pi = p
    gaps = []
    for eps in (1e-6, 1e-9, 1e-12):
        q = q0.clone()
        q[2] = eps
        q /= q.sum()
        at_eps = solve(p, q, max_divergence=budget, divergence=name)
        gaps.append(abs(float(at_eps.acceptance) - anywhere))
        # support="any" is continuous too: with every q_i > 0 it is the default solution
        assert float(solve(p, q, max_divergence=budget, divergence=name, support="any").acceptance) == float(
            at_eps.acceptance)
    assert gaps[2] <= gaps[1] <= gaps[0] + 1e-12
    assert gaps[2] < 0.05 * jump, gaps


def test_kl_limit_is_slow_and_both_supports_agree():
    """An infinite zero cost: both supports agree at eps = 0; at eps = 1e-12 a small mass remains."""
    p, q0 = _t([0.3, 0.5, 0.2]), _t([0.6, 0.4, 0.0])
    at_zero = solve(p, q0, max_divergence=0.3, divergence="kl")
    assert torch.equal(at_zero.acceptance, solve(p, q0, max_divergence=0.3, divergence="kl",
                                                 support="any").acceptance)
    q = q0.clone()
    q[2] = 1e-12
    q /= q.sum()
    gap = float(solve(p, q, max_divergence=0.3, divergence="kl").acceptance - at_zero.acceptance)
    assert 0.3 / math.log(1e12) / 2 < gap < 2 * 0.3 / math.log(1e12)  # of order D / log(1 / eps) (docs/theory.md)


def test_rows_without_zeros_and_batches_are_unchanged():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(20), size=(2, 3))
    q = rng.dirichlet(np.ones(20), size=(2, 3))
    q[0, :, :4] = 0.0  # first batch row: zeros, second: none
    q /= q.sum(-1, keepdims=True)
    budgets = _t([[0.01, 0.5, 3.0], [0.01, 0.5, 3.0]])
    both = solve(_t(p), _t(q), max_divergence=budgets, divergence="hellinger", support="any")
    plain = solve(_t(p), _t(q), max_divergence=budgets, divergence="hellinger")
    for field in ("a", "b", "acceptance", "achieved_divergence"):
        assert torch.equal(getattr(both, field)[1], getattr(plain, field)[1])
    for i in range(2):
        for j in range(3):
            one = solve(_t(p[i, j]), _t(q[i, j]), max_divergence=float(budgets[i, j]), divergence="hellinger",
                        support="any")
            assert float(one.acceptance) == pytest.approx(float(both.acceptance[i, j]), abs=1e-12)
            assert float(one.off_support) == pytest.approx(float(both.off_support[i, j]), abs=1e-12)
    assert float(both.off_support[0, 2]) > 0 and not both.off_support[1].any()


def test_float32_and_the_distribution_helper():
    p = torch.tensor([0.2, 0.3, 0.5])
    q = torch.tensor([0.5, 0.5, 0.0])
    sol = solve(p, q, max_divergence=0.4, divergence="rkl", support="any")
    ref = solve(p.double(), q.double(), max_divergence=0.4, divergence="rkl", support="any")
    assert sol.acceptance.dtype == torch.float32 and sol.off_support.dtype == torch.float32
    assert float(sol.acceptance) == pytest.approx(float(ref.acceptance), abs=1e-6)
    pi = mentored_distribution(p, q, sol.a, sol.b, off_support=sol.off_support)
    assert float(pi.sum()) == pytest.approx(1.0, abs=1e-6)
    assert float(acceptance_probability(p, pi)) == pytest.approx(float(sol.acceptance), abs=1e-6)
    assert float(pi[2]) == pytest.approx(float(sol.off_support), abs=1e-7)


@pytest.mark.parametrize("kwargs,match", [
    (dict(support="all"), "support must be one of"),
    (dict(support=None), "support must be one of"),
    (dict(support="any", mode="bound"), "support='any' needs mode='exact'"),
    (dict(on_infeasible="ignore"), "on_infeasible must be one of"),
])
def test_bad_arguments_are_named(kwargs, match):
    p, q = _t([0.5, 0.5]), _t([1.0, 0.0])
    with pytest.raises(ValueError, match=match):
        solve(p, q, max_divergence=0.1, **kwargs)
    with pytest.raises(ValueError, match="off_support"):
        mentored_distribution(p, q, 0.0, 0.0, off_support=1.5)
