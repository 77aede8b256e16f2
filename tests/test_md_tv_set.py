"""The TV-MD optimal set (paper Section 3.2): LP-verified, and the KL projection against scipy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog, minimize

from mdboost.md.solve import acceptance_probability, mentored_distribution, solve
from mdboost.md.tv_set import (BoostedMentor, geometric_mixture, is_tv_optimal, project_tv_optimal,
                               tv_optimal_set)
from tests.test_md_reference import random_pair

T64 = dict(dtype=torch.float64)


def _pair(seed, n, **kw):
    rng = np.random.default_rng(seed)
    p, q = random_pair(rng, n, **kw)
    if seed % 3 == 0:  # a coordinate where p_i = q_i (it belongs to no side of the box)
        p[0] = q[0]
        p = p / p.sum()
    return p, q


def _lp(p, q, budget, objective=None, acceptance=None):
    """max sum_i m_i s.t. m <= pi, m <= p, TV(pi, q) <= D, pi in the simplex (variables pi, m, e).

    With ``acceptance``: the optimal face (sum m >= acceptance), minimizing ``objective . pi``
    instead (a vertex of that face).
    """
    n = len(p)
    eye, zero = np.eye(n), np.zeros((n, n))
    a_ub = [np.hstack([-eye, eye, zero]),  # m - pi <= 0
            np.hstack([eye, zero, -eye]),  # pi - e <= q
            np.hstack([-eye, zero, -eye]),  # -pi - e <= -q
            np.hstack([np.zeros(2 * n), np.full(n, 0.5)])[None]]  # TV(pi, q) <= D
    b_ub = [np.zeros(n), q, -q, [budget]]
    if acceptance is None:
        c = np.hstack([np.zeros(n), -np.ones(n), np.zeros(n)])
    else:
        a_ub.append(np.hstack([np.zeros(n), -np.ones(n), np.zeros(n)])[None])
        b_ub.append([-(acceptance - 1e-11)])
        c = np.hstack([objective, np.zeros(2 * n)])
    bounds = [(0, None)] * n + [(0, float(x)) for x in p] + [(0, None)] * n
    res = linprog(c, A_ub=np.vstack(a_ub), b_ub=np.hstack(b_ub), A_eq=np.hstack([np.ones(n), np.zeros(2 * n)])[None],
                  b_eq=[1.0], bounds=bounds, method="highs")
    assert res.status == 0, res.message
    return res


@pytest.mark.parametrize("seed", range(12))
def test_lp_optimum_is_the_set_acceptance_and_every_member_is_optimal(seed):
    p, q = _pair(seed, 3 + seed % 5, zeros_q=seed % 2)
    tv = 0.5 * np.abs(p - q).sum()
    pt, qt = torch.tensor(p, **T64), torch.tensor(q, **T64)
    rng = np.random.default_rng(100 + seed)
    for budget in [0.0, 0.2 * tv, 0.7 * tv, tv, 1.5 * tv + 0.01]:
        best = -_lp(p, q, budget).fun
        s = tv_optimal_set(pt, qt, budget)
        assert best == pytest.approx(min(1.0, 1 - tv + budget), abs=1e-9)
        assert float(s.acceptance) == pytest.approx(best, abs=1e-9)
        assert float(s.divergence) == pytest.approx(min(budget, tv), abs=1e-12)
        sol = solve(pt, qt, max_divergence=budget, divergence="tv")
        members = []
        if not bool(((qt == 0) & (pt > 0)).any()):  # the clamp stays on q's support (optimal among pi << q)
            members.append(mentored_distribution(pt, qt, sol.a, sol.b))
        if tv > 0:
            lam = min(budget, tv) / tv
            members.append((1 - lam) * qt + lam * pt)  # the convex combination
        members += [project_tv_optimal(pt, qt, budget, torch.tensor(rng.dirichlet(np.full(len(p), 0.5)), **T64))
                    for _ in range(6)]
        for pi in members:
            assert bool(is_tv_optimal(pi, pt, qt, budget, atol=1e-9))
            assert float(acceptance_probability(pt, pi)) == pytest.approx(best, abs=1e-9)  # LP-optimal
            assert 0.5 * float((pi - qt).abs().sum()) <= budget + 1e-9  # feasible
            assert float(pi.sum()) == pytest.approx(1.0, abs=1e-12) and bool((pi >= 0).all())


@pytest.mark.parametrize("seed", range(10))
def test_random_lp_optima_satisfy_the_box_description(seed):
    """Vertices of the LP's optimal face, in random directions, are all members of the set."""
    p, q = _pair(seed, 3 + seed % 6, zeros_q=seed % 2, zeros_p=(seed // 2) % 2)
    tv = 0.5 * np.abs(p - q).sum()
    pt, qt = torch.tensor(p, **T64), torch.tensor(q, **T64)
    rng = np.random.default_rng(seed)
    for budget in [0.1 * tv, 0.5 * tv, 0.95 * tv, 2 * tv]:
        best = -_lp(p, q, budget).fun
        for _ in range(8):
            pi = _lp(p, q, budget, objective=rng.normal(size=len(p)), acceptance=best).x[:len(p)]
            assert bool(is_tv_optimal(torch.tensor(pi, **T64), pt, qt, budget, atol=1e-7)), (pi, p, q, budget)


def test_points_outside_the_box_are_not_optimal():
    p, q = _pair(1, 6)
    pt, qt = torch.tensor(p, **T64), torch.tensor(q, **T64)
    budget = 0.4 * 0.5 * float((pt - qt).abs().sum())
    pi = project_tv_optimal(pt, qt, budget, torch.ones(6, **T64))
    best = float(tv_optimal_set(pt, qt, budget).acceptance)
    up = torch.nonzero(pt > qt).flatten()
    lo_side = torch.nonzero(pt < qt).flatten()
    moved = pi.clone()  # mass from the L side to above p on the U side: feasible TV, lower acceptance
    eps = 1e-3
    i, j = int(up[0]), int(lo_side[0])
    moved[i], moved[j] = pt[i] + eps, moved[j] - eps
    moved = moved / moved.sum()
    assert not bool(is_tv_optimal(moved, pt, qt, budget, atol=1e-9))
    assert float(acceptance_probability(pt, moved)) < best - 1e-6 or 0.5 * float((moved - qt).abs().sum()) > budget


def _scipy_projection(p, q, budget, r):
    n = len(p)
    up = p >= q
    tv = min(p[up].sum() - q[up].sum(), q[~up].sum() - p[~up].sum())
    d = min(budget, tv)
    lo, hi = np.minimum(p, q), np.maximum(p, q)

    def kl(x):
        x = np.maximum(x, 1e-300)
        return float(np.sum(x * np.log(x / r)))

    cons = [{"type": "eq", "fun": lambda x: x[up].sum() - (q[up].sum() + d)},
            {"type": "eq", "fun": lambda x: x[~up].sum() - (q[~up].sum() - d)}]
    best = None
    for start in [0.5 * (lo + hi), lo + 0.2 * (hi - lo), lo + 0.8 * (hi - lo)]:
        res = minimize(kl, start, jac=lambda x: np.log(np.maximum(x, 1e-300) / r) + 1, method="SLSQP",
                       bounds=list(zip(lo, hi)), constraints=cons, options={"ftol": 1e-14, "maxiter": 500})
        if res.success and (best is None or res.fun < best.fun):
            best = res
    return best


@pytest.mark.parametrize("seed", range(12))
def test_projection_equals_a_generic_constrained_optimizer(seed):
    p, q = _pair(seed, 3 + seed % 6)
    rng = np.random.default_rng(50 + seed)
    r = rng.dirichlet(np.full(len(p), 0.7)) + 1e-3
    tv = 0.5 * np.abs(p - q).sum()
    pt, qt, rt = (torch.tensor(x, **T64) for x in (p, q, r))
    for budget in [0.1 * tv, 0.5 * tv, 0.9 * tv]:
        pi = project_tv_optimal(pt, qt, budget, rt).numpy()
        ref = _scipy_projection(p, q, budget, r)
        ours = float(np.sum(pi * np.log(np.maximum(pi, 1e-300) / r)))
        assert ours <= ref.fun + 1e-9  # never worse than the generic optimizer
        np.testing.assert_allclose(pi, ref.x, atol=2e-5)  # KL is strictly convex: the same point


@pytest.mark.parametrize("seed", range(6))
def test_projection_has_the_clip_form_with_one_scale_per_group(seed):
    p, q = _pair(seed, 40)
    r = np.random.default_rng(seed).dirichlet(np.full(40, 1.0))
    pt, qt, rt = (torch.tensor(x, **T64) for x in (p, q, r))
    tv = 0.5 * float((pt - qt).abs().sum())
    pi = project_tv_optimal(pt, qt, 0.5 * tv, rt)
    lo, hi = torch.minimum(pt, qt), torch.maximum(pt, qt)
    for side in (pt >= qt, pt < qt):
        free = side & (pi > lo + 1e-12) & (pi < hi - 1e-12)
        assert free.any()
        scale = pi[free] / rt[free]
        assert float(scale.max() - scale.min()) <= 1e-9 * float(scale.max())
        s = float(scale.mean())
        assert torch.allclose(pi[side], (s * rt[side]).clamp(min=lo[side], max=hi[side]), atol=1e-12)


def test_limits_batching_and_dtypes():
    rng = np.random.default_rng(3)
    pairs = [_pair(i, 9) for i in range(6)]
    p = torch.tensor(np.stack([a for a, _ in pairs]), **T64).reshape(2, 3, 9)
    q = torch.tensor(np.stack([b for _, b in pairs]), **T64).reshape(2, 3, 9)
    r = torch.tensor(rng.dirichlet(np.ones(9), size=6), **T64).reshape(2, 3, 9)
    budgets = torch.tensor([[0.0, 0.05, 0.1], [0.2, 0.4, 5.0]], **T64)
    batched = project_tv_optimal(p, q, budgets, r)
    for i in range(2):
        for j in range(3):
            row = project_tv_optimal(p[i, j], q[i, j], float(budgets[i, j]), r[i, j])
            assert torch.allclose(batched[i, j], row, atol=1e-15)
    assert torch.allclose(batched[0, 0], q[0, 0], atol=1e-15)  # D = 0: the target
    assert torch.allclose(batched[1, 2], p[1, 2], atol=1e-15)  # D >= TV: the drafter
    # an all-zero reference: the convex combination (the room hi - lo is shared uniformly)
    tv = 0.5 * (p - q).abs().sum(-1)
    lam = (budgets.clamp(max=tv) / tv)[..., None]
    assert torch.allclose(project_tv_optimal(p, q, budgets, torch.zeros_like(r)), (1 - lam) * q + lam * p, atol=1e-12)
    # float32 in, float32 out, still a member
    pi32 = project_tv_optimal(p.float(), q.float(), 0.1, r.float())
    assert pi32.dtype == torch.float32 and bool(is_tv_optimal(pi32.double(), p, q, 0.1, atol=1e-6).all())
    assert tv_optimal_set(p[:0], q[:0], 0.1).upper_sum.shape == (0, 3)
    # a reference that vanishes on part of each group: those coordinates stay at their lower bound
    r0 = r.clone()
    r0[..., :3] = 0
    pi0 = project_tv_optimal(p, q, 0.05, r0)
    assert bool(is_tv_optimal(pi0, p, q, 0.05, atol=1e-12).all())


def test_bad_inputs_name_the_argument():
    p = torch.tensor([0.5, 0.5], **T64)
    with pytest.raises(ValueError, match="max_divergence"):
        tv_optimal_set(p, p, -0.1)
    with pytest.raises(ValueError, match="reference"):
        project_tv_optimal(p, p, 0.1, torch.tensor([1.0, -1.0], **T64))
    with pytest.raises(ValueError, match="reference must have the shape"):
        project_tv_optimal(p, p, 0.1, torch.ones(3, **T64))
    with pytest.raises(ValueError, match="mentored_probs"):
        is_tv_optimal(torch.tensor([0.5, float("nan")], **T64), p, p, 0.1)
    with pytest.raises(ValueError, match="atol"):
        is_tv_optimal(p, p, p, 0.1, atol=-1.0)
    with pytest.raises(ValueError, match="max_divergence"):
        BoostedMentor(1.0, 1.0, -1.0)


def test_geometric_mixture_and_boosted_mentor():
    p, q = (torch.tensor(x, **T64) for x in _pair(4, 12))
    c1, c2 = 0.7, 0.4
    mix = geometric_mixture(p, q, c1, c2)
    ref = q ** c1 * p ** c2
    assert torch.allclose(mix, ref / ref.sum(), atol=1e-15)
    mentor = BoostedMentor(c1, c2, max_divergence=0.1, scale=2.0)
    pi = mentor(p[None, None], q[None, None])[0, 0]
    assert torch.allclose(pi, project_tv_optimal(p, q, 0.1, geometric_mixture(p, q, 2 * c1, 2 * c2)))
    assert bool(is_tv_optimal(pi, p, q, 0.1))
