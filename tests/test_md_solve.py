"""solve / Breakpoints against the brute-force reference, scipy SLSQP and the paper's properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import f_divergence, resolve
from mdboost.md.solve import acceptance_probability, mentored_distribution, solve
from tests._md_pairs import bracketed_point
from tests.test_md_reference import NAMES, REF, clamp, ref_divergence, ref_dual, ref_primal, random_pair

T64 = dict(dtype=torch.float64)


def _t(x):
    return torch.as_tensor(np.asarray(x), **T64)


def _case(kind, n, seed):
    rng = np.random.default_rng(seed)
    if kind == "plain":
        return random_pair(rng, n)
    if kind == "zeros":
        return random_pair(rng, n, zeros_p=max(1, n // 5), zeros_q=max(1, n // 7))
    if kind == "peaked":
        return random_pair(rng, n, concentration=0.3, peaked=True)
    if kind == "equal":
        p, _ = random_pair(rng, n)
        return p, p.copy()
    if kind == "onehot":
        _, q = random_pair(rng, n)
        p = np.zeros(n)
        p[int(np.argmax(q)) if seed % 2 else 0] = 1.0
        return p, q
    raise AssertionError(kind)


CASES = [(k, n) for k in ["plain", "zeros", "peaked", "equal", "onehot"] for n in (2, 5, 40)] + [
    ("plain", 5000),
    ("zeros", 5000),
    ("peaked", 5000),
]


@pytest.mark.parametrize("kind,n", CASES)
def test_primal_matches_bruteforce_every_divergence(kind, n):
    """Both search paths (all-breakpoints for small V, nested search for large V) on each case."""
    p, q = _case(kind, n, seed=n + len(kind))
    names = NAMES if n <= 5 else ["kl", "rkl", "neyman", "alpha:-1.5"] if n <= 40 else ["kl", "rkl"]
    budgets = [0.0, 1e-4, 0.02, 0.3, 5.0] if n <= 40 else [1e-4, 0.3]
    refs = {name: [ref_primal(p, q, budget, name) for budget in budgets] for name in names}
    for bracket in ("large", "small", None):  # None: for_divergence (the scalar search of few rows)
        bp = Breakpoints.build(_t(p)[None].expand(len(budgets), n), _t(q)[None].expand(len(budgets), n))
        for name in names:
            pt = (bp.for_divergence(_t(budgets), name) if bracket is None
                  else bracketed_point(bp, budgets, name, bracket)[0])
            for i, budget in enumerate(budgets):
                assert float(pt.acceptance[i]) == pytest.approx(refs[name][i], abs=1e-7), (name, budget, bracket)
                pi = clamp(p, q, float(pt.a[i]), float(pt.b[i]))
                assert pi.sum() == pytest.approx(1.0, abs=1e-9)
                assert np.minimum(pi, p).sum() == pytest.approx(float(pt.acceptance[i]), abs=1e-9)
                assert ref_divergence(pi, q, name) <= budget + 1e-9


@pytest.mark.parametrize("kind,n", CASES)
def test_dual_matches_bruteforce(kind, n):
    p, q = _case(kind, n, seed=3 * n)
    targets = torch.tensor([0.0, 0.3, 0.6, 0.8, 0.95, 1.0], **T64)
    sol = solve(_t(p).expand(6, n), _t(q).expand(6, n), min_acceptance=targets, divergence="hellinger")
    for i, target in enumerate(targets.tolist()):
        a, b, acc = ref_dual(p, q, target)
        assert float(sol.acceptance[i]) == pytest.approx(acc, abs=1e-9)
        assert float(sol.a[i]) == pytest.approx(a, abs=1e-7 * max(1.0, a))
        assert float(sol.b[i]) == pytest.approx(b, abs=1e-7)


def _slsqp_primal(p, q, budget, name, starts, rng):
    """max sum t s.t. t <= pi, t <= p, D_f(pi||q) <= budget, pi in simplex; returns (acc, D)."""
    n = len(p)
    f, _ = REF[name]
    cons = [
        {"type": "eq", "fun": lambda x: x[:n].sum() - 1},
        {"type": "ineq", "fun": lambda x: budget - float(np.sum(q * f(np.maximum(x[:n], 1e-300) / q)))},
        {"type": "ineq", "fun": lambda x: x[:n] - x[n:]},
        {"type": "ineq", "fun": lambda x: p - x[n:]},
    ]
    best = []
    for _ in range(starts):
        pi0 = rng.dirichlet(np.ones(n))
        x0 = np.concatenate([pi0, np.minimum(pi0, p) * 0.5])
        res = minimize(lambda x: -x[n:].sum(), x0, method="SLSQP", constraints=cons,
                       bounds=[(0, 1)] * (2 * n), options={"maxiter": 300, "ftol": 1e-12})
        pi = np.clip(res.x[:n], 0, None)
        pi = pi / pi.sum()
        best.append((float(np.minimum(pi, p).sum()), ref_divergence(pi, q, name)))
    return best


@pytest.mark.parametrize("name", ["kl", "hellinger", "pearson", "rkl"])
@pytest.mark.parametrize("seed", range(3))
def test_slsqp_never_beats_the_clamp(name, seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 9))
    p, q = random_pair(rng, n)
    budget = float(rng.choice([0.01, 0.05, 0.2]))
    for acc, d in _slsqp_primal(p, q, budget, name, starts=6, rng=rng):
        ours = solve(_t(p), _t(q), max_divergence=max(d, budget), divergence=name)
        assert acc <= float(ours.acceptance) + 1e-7


@pytest.mark.parametrize("name", ["kl", "hellinger", "pearson", "neyman"])
def test_dual_is_f_independent_and_optimal(name):
    """Thm 3.13: the same (a, b) for every f; SLSQP on min D_f s.t. P_acc >= P never does better."""
    rng = np.random.default_rng(7)
    n = 6
    p, q = random_pair(rng, n)
    f, _ = REF[name]
    target = 1 - 0.5 * np.abs(p - q).sum() + 0.15
    sol = solve(_t(p), _t(q), min_acceptance=target, divergence=name)
    kl = solve(_t(p), _t(q), min_acceptance=target, divergence="kl")
    assert torch.equal(sol.a, kl.a) and torch.equal(sol.b, kl.b)
    ours = float(sol.achieved_divergence)
    cons = [
        {"type": "eq", "fun": lambda x: x[:n].sum() - 1},
        {"type": "ineq", "fun": lambda x: x[n:].sum() - target},
        {"type": "ineq", "fun": lambda x: x[:n] - x[n:]},
        {"type": "ineq", "fun": lambda x: p - x[n:]},
    ]
    for _ in range(6):
        pi0 = rng.dirichlet(np.ones(n))
        x0 = np.concatenate([pi0, np.minimum(pi0, p)])
        res = minimize(lambda x: float(np.sum(q * f(np.maximum(x[:n], 1e-12) / q))), x0, method="SLSQP",
                       constraints=cons, bounds=[(1e-12, 1)] * n + [(0, 1)] * n, options={"maxiter": 300})
        pi = res.x[:n] / res.x[:n].sum()
        if np.minimum(pi, p).sum() >= target - 1e-9:
            assert ref_divergence(pi, q, name) >= ours - 1e-6


@pytest.mark.parametrize("name", ["kl", "rkl", "hellinger", "pearson", "neyman", "js", "alpha:1.5", "alpha:-1.5"])
def test_primal_optimum_lies_on_the_common_curve(name):
    """For every strictly convex f the primal optimum is the dual point of the same acceptance."""
    rng = np.random.default_rng(11)
    p, q = (torch.as_tensor(np.stack(x), **T64) for x in zip(*[random_pair(rng, 30) for _ in range(4)]))
    p, q = p.reshape(4, 30), q.reshape(4, 30)
    bp = Breakpoints.build(p, q)
    primal = bp.for_divergence(0.05, name)
    dual = bp.for_acceptance(primal.acceptance)
    torch.testing.assert_close(primal.a, dual.a, atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(primal.b, dual.b, atol=1e-8, rtol=1e-8)


def test_tv_oracle_and_convex_combination():
    rng = np.random.default_rng(5)
    p, q = (np.stack(x) for x in zip(*[random_pair(rng, 50) for _ in range(6)]))
    tv = 0.5 * np.abs(p - q).sum(-1)
    budgets = np.array([0.0, 0.01, 0.1, 0.2, 0.5, 1.0])
    sol = solve(_t(p), _t(q), max_divergence=_t(budgets), divergence="tv")
    np.testing.assert_allclose(sol.acceptance.numpy(), np.minimum(1, 1 - tv + budgets), atol=1e-10)
    lam = np.minimum(budgets / tv, 1)[:, None]
    combo = (1 - lam) * q + lam * p
    acc_combo = acceptance_probability(_t(p), _t(combo)).numpy()
    np.testing.assert_allclose(acc_combo, sol.acceptance.numpy(), atol=1e-10)


@pytest.mark.parametrize("name", ["kl", "rkl", "hellinger", "pearson", "neyman", "alpha:1.5"])
def test_divergence_increases_along_the_curve_and_theorem_312_sandwich(name):
    rng = np.random.default_rng(21)
    p, q = random_pair(rng, 25, zeros_p=2)
    bp = Breakpoints.build(_t(p), _t(q))
    curve = bp.curve()
    ok = ~torch.isnan(curve.acceptance)
    a, b, acc = (x[ok].numpy() for x in curve)
    assert np.all(np.diff(acc) >= -1e-12) and np.all(np.diff(a) >= -1e-12) and np.all(np.diff(b) >= -1e-12)
    div = resolve(name)
    fp1 = div.fprime_one

    def g(z):
        return REF[name][0](np.asarray(z, float)) - fp1 * (np.asarray(z, float) - 1)

    divs = []
    for ai, bi, acci in zip(a, b, acc):
        pi = clamp(p, q, ai, bi)
        assert np.minimum(pi, p).sum() == pytest.approx(acci, abs=1e-10)
        d = ref_divergence(pi, q, name)
        divs.append(d)
        r = p / q
        in_a, in_b = r > 1 + ai + 1e-12, r < 1 - bi - 1e-12
        lower = g(1 + ai) * q[in_a].sum() + (g(1 - bi) * q[in_b].sum() if in_b.any() else 0.0)
        upper = lower + q[~in_a & ~in_b].sum() * max(g(1 + ai), g(1 - bi))
        assert lower - 1e-9 <= d <= upper + 1e-9
    assert all(d2 >= d1 - 1e-10 for d1, d2 in zip(divs, divs[1:]))


@pytest.mark.parametrize("name", ["kl", "rkl", "hellinger", "pearson", "neyman", "tv", "js"])
@pytest.mark.parametrize("bracket", ["small", "large", None])  # None: solve's own pick
def test_bound_mode_never_exceeds_budget_and_is_below_exact(name, bracket):
    rng = np.random.default_rng(31)
    p, q = (np.stack(x) for x in zip(*[random_pair(rng, 40, zeros_p=3) for _ in range(8)]))
    budgets = _t(np.geomspace(1e-4, 2.0, 8))
    exact = solve(_t(p), _t(q), max_divergence=budgets, divergence=name)
    bound = solve(_t(p), _t(q), max_divergence=budgets, divergence=name, mode="bound")
    if bracket is not None:
        point = bracketed_point(Breakpoints.build(_t(p), _t(q)), budgets, name, bracket, bound=True)[0]
        achieved = f_divergence(mentored_distribution(_t(p), _t(q), point.a, point.b), _t(q), name)
        bound = bound.__class__(point.a, point.b, point.acceptance, achieved, bound.sd_acceptance)
    assert torch.all(bound.achieved_divergence <= budgets + 1e-10)
    assert torch.all(bound.acceptance <= exact.acceptance + 1e-10)
    assert torch.all(bound.acceptance >= bound.sd_acceptance - 1e-12)


@pytest.mark.parametrize("name", ["kl", "rkl", "hellinger", "neyman"])
@pytest.mark.parametrize("bracket", ["small", "large"])
def test_bound_mode_with_the_budget_inside_a_jump_of_the_theorem_312_bound(name, bracket):
    """The Thm 3.12 bound jumps up at a breakpoint (a token leaves ``A`` for ``M``): a budget inside
    the jump is met at the breakpoint itself, the largest point whose bound fits. It fell back to
    ``pi = q`` (acceptance 0.6 instead of 0.9)."""
    p, q = np.array([0.5, 0.4, 0.1]), np.array([0.25, 0.25, 0.5])  # ratios 2, 1.6, 0.2
    a, b = 0.6, 0.6  # the A-breakpoint of the ratio 1.6: E(a) = F(b) = 0.1, acceptance 0.9
    assert clamp(p, q, a, b).sum() == pytest.approx(1.0, abs=1e-15)
    fp1 = resolve(name).fprime_one

    def g(z):
        return float(REF[name][0](np.asarray(z, float)) - fp1 * (z - 1))

    ga, gb = g(1 + a), g(1 - b)
    tight = 0.5 * ga + 0.5 * gb  # the token of ratio 1 + a counted in A (its D_f term is q g(1 + a))
    loose = 0.25 * ga + 0.5 * gb + 0.25 * max(ga, gb)  # A = {r > 1 + a}: the limit from beyond
    assert tight < loose
    budget = (tight + loose) / 2
    sol = solve(_t(p), _t(q), max_divergence=budget, divergence=name, mode="bound")
    assert float(sol.acceptance) == pytest.approx(0.9, abs=1e-9)
    assert float(sol.achieved_divergence) <= budget
    point = bracketed_point(Breakpoints.build(_t(p), _t(q)), budget, name, bracket, bound=True)[0]
    assert float(point.acceptance) == pytest.approx(0.9, abs=1e-9)
    assert (float(point.a), float(point.b)) == pytest.approx((a, b), abs=1e-9)
    # the bound never decreases along the curve: a larger budget never gives a smaller acceptance
    sols = solve(_t(p)[None].expand(3, 3), _t(q)[None].expand(3, 3), max_divergence=_t([tight, budget, loose]),
                 divergence=name, mode="bound")
    assert torch.all(sols.acceptance.diff() >= -1e-12)


def test_float32_within_1e_4_on_large_peaked_rows():
    rng = np.random.default_rng(3)
    pairs = [random_pair(rng, 5000, concentration=0.1, peaked=True), random_pair(rng, 5000)]
    for p, q in pairs:
        p32, q32 = torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32)
        for name in ["kl", "hellinger"]:
            ref = ref_primal(p32.double().numpy(), q32.double().numpy(), 0.05, name)
            got = solve(p32, q32, max_divergence=0.05, divergence=name)
            assert got.acceptance.dtype == torch.float32
            assert float(got.acceptance) == pytest.approx(ref, abs=1e-4)


def test_top_k_restriction_equals_masked_full_solve():
    """Lemma 6.1: on a masked target the optimum is supported on the mask."""
    rng = np.random.default_rng(9)
    p, q = random_pair(rng, 60)
    keep = np.argsort(-q)[:8]
    qm = np.zeros_like(q)
    qm[keep] = q[keep] / q[keep].sum()
    full = solve(_t(p), _t(qm), max_divergence=0.1)
    small_p = np.append(p[keep], 1 - p[keep].sum())
    small_q = np.append(qm[keep], 0.0)
    small = solve(_t(small_p), _t(small_q), max_divergence=0.1)
    for x, y in zip((full.a, full.b, full.acceptance), (small.a, small.b, small.acceptance)):
        assert float(x) == pytest.approx(float(y), abs=1e-10)
    pi = mentored_distribution(_t(p), _t(qm), full.a, full.b).numpy()
    assert np.all(pi[qm == 0] == 0)


def test_batched_budgets_broadcast_and_shapes():
    rng = np.random.default_rng(2)
    p, q = (np.stack(x).reshape(2, 3, 10) for x in zip(*[random_pair(rng, 10) for _ in range(6)]))
    budgets = torch.tensor([[0.01], [0.2]], **T64)
    sol = solve(_t(p), _t(q), max_divergence=budgets)
    assert sol.a.shape == (2, 3) and sol.achieved_divergence.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            one = solve(_t(p[i, j]), _t(q[i, j]), max_divergence=float(budgets[i, 0]))
            assert float(one.acceptance) == pytest.approx(float(sol.acceptance[i, j]), abs=1e-12)


def test_extreme_budgets():
    rng = np.random.default_rng(4)
    p, q = random_pair(rng, 20, zeros_q=2)
    zero = solve(_t(p), _t(q), max_divergence=0.0)
    assert float(zero.a) == 0.0 and float(zero.b) == 0.0
    big = solve(_t(p), _t(q), max_divergence=float("inf"), divergence="hellinger")
    assert float(big.acceptance) == pytest.approx(1 - p[q == 0].sum(), abs=1e-12)
    pi = mentored_distribution(_t(p), _t(q), big.a, big.b).numpy()
    assert pi.sum() == pytest.approx(1.0, abs=1e-12) and np.all(pi[q == 0] == 0)
    assert float(f_divergence(_t(pi), _t(q), "hellinger")) == pytest.approx(float(big.achieved_divergence))
    np.testing.assert_allclose(float(big.boost_coefficient), np.sqrt((1 + float(big.a)) / (1 - float(big.b))))
