"""``solve``'s ``feasible`` mask, ``on_infeasible="raise"``, and outputs kept in range by rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import f_divergence
from mdboost.md.solve import mentored_distribution, solve

T64 = dict(dtype=torch.float64)


def _top_k_target(vocab=50, k=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(vocab, generator=gen, **T64), -1)
    logits = torch.randn(vocab, generator=gen, **T64)
    q = torch.softmax(torch.where(logits >= logits.topk(k).values[-1], logits, -torch.inf), -1)
    return p, q


def test_infeasible_dual_target_is_flagged_on_a_top_k_target():
    p, q = _top_k_target()
    reachable = float(1 - p[q == 0].sum())  # the drafter's mass the target excludes is never accepted
    assert reachable < 0.99
    sol = solve(p, q, min_acceptance=0.99, divergence="kl")
    assert not bool(sol.feasible)
    assert float(sol.acceptance) == pytest.approx(reachable, abs=1e-12)  # the curve's end
    with pytest.raises(ValueError, match=r"min_acceptance=0\.99 is above the largest reachable acceptance"):
        solve(p, q, min_acceptance=0.99, divergence="kl", on_infeasible="raise")
    # at the reachable maximum itself, and below it, the target is met
    edge = Breakpoints.build(p, q).max_acceptance
    for target in (edge, reachable / 2, 0.0):
        ok = solve(p, q, min_acceptance=target, on_infeasible="raise")
        assert bool(ok.feasible) and float(ok.acceptance) >= float(target) - 1e-9


def test_feasible_per_row_and_for_budgets():
    p1, q1 = _top_k_target(seed=1)
    p2, q2 = _top_k_target(seed=2)
    p, q = torch.stack([p1, p2]), torch.stack([q1, q2])
    bp = Breakpoints.build(p, q)
    top = bp.max_acceptance
    targets = torch.stack([(bp.sd_acceptance[0] + top[0]) / 2, top[1] + 0.01])
    sol = solve(p, q, min_acceptance=targets)
    assert sol.feasible.tolist() == [True, False]
    assert float(sol.acceptance[0]) == pytest.approx(float(targets[0]), abs=1e-9)
    with pytest.raises(ValueError, match=r"at row \(1,\) \(1 infeasible rows\)"):
        solve(p, q, min_acceptance=targets, on_infeasible="raise")
    primal = solve(p, q, max_divergence=torch.tensor([0.0, 10.0], **T64))
    assert primal.feasible.dtype == torch.bool and primal.feasible.all()


def test_support_any_makes_the_target_reachable_for_a_finite_zero_cost():
    p, q = _top_k_target()
    sol = solve(p, q, min_acceptance=0.99, divergence="hellinger", support="any", on_infeasible="raise")
    assert bool(sol.feasible) and float(sol.acceptance) == pytest.approx(0.99, abs=1e-12)
    kl = solve(p, q, min_acceptance=0.99, divergence="kl", support="any")  # infinite cost on q = 0
    assert not bool(kl.feasible)


def _kl_raw(pi, q):
    """``sum_i pi_i log(pi_i / q_i)`` as the plain formula gives it (no clamp)."""
    return float(torch.sum(torch.xlogy(pi, pi) - torch.xlogy(pi, q)))


def test_negative_rounding_divergence_is_zero_and_the_rest_unchanged():
    """Rows trusted with ``validate=False`` that sum to 1 only within the tolerance.

    ``p = q (1 - 7e-8)``: the true (rescaled) rows are equal, so the optimum is ``pi = q``
    with divergence 0 and acceptance 1. The solution's own ``pi`` has a raw KL of about -7e-8.
    """
    q = torch.tensor([0.3, 0.7], **T64)
    p = q * (1 - 7e-8)
    sol = solve(p, q, max_divergence=1.0, divergence="kl", validate=False)
    pi = mentored_distribution(p, q, sol.a, sol.b, validate=False)
    assert _kl_raw(pi, q) < -5e-8  # a genuine negative-rounding case
    assert float(sol.achieved_divergence) >= 0.0
    true = solve(p / p.sum(), q, max_divergence=1.0, divergence="kl")  # the rows as they should be
    assert float(sol.achieved_divergence) == pytest.approx(float(true.achieved_divergence), abs=1e-12)
    assert float(sol.acceptance) == pytest.approx(float(true.acceptance), abs=1e-7)
    assert float(sol.acceptance) == pytest.approx(1.0, abs=1e-7)


def test_negative_rounding_acceptance_is_zero_and_the_rest_unchanged():
    """Disjoint supports, ``p`` summing to ``1 + 2e-8``: the raw acceptance ``1 - p(q = 0)`` is -2e-8.

    True value (rows rescaled): no token of ``p`` is in the target's support, acceptance 0. The
    same rows with a shared token keep their (positive) acceptance to the tolerance.
    """
    q = torch.tensor([1.0, 0.0, 0.0], **T64)
    p = torch.tensor([0.0, 0.6, 0.4 + 2e-8], **T64)
    assert float(1 - p[q == 0].sum()) < -1e-8  # the curve's end as the formula gives it
    for kwargs in (dict(min_acceptance=0.5), dict(max_divergence=0.2)):
        sol = solve(p, q, divergence="hellinger", validate=False, **kwargs)
        assert float(sol.acceptance) >= 0.0
        assert float(sol.acceptance) == pytest.approx(0.0, abs=1e-12)
        assert float(sol.sd_acceptance) >= 0.0
        assert not bool(sol.feasible) if "min_acceptance" in kwargs else bool(sol.feasible)
    p2 = torch.tensor([0.3, 0.3, 0.4 + 2e-8], **T64)
    sol = solve(p2, q, min_acceptance=0.5, divergence="hellinger", validate=False)
    true = solve(p2 / p2.sum(), q, min_acceptance=0.5, divergence="hellinger")
    assert float(sol.acceptance) == pytest.approx(float(true.acceptance), abs=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_outputs_stay_in_range_on_many_trusted_rows(dtype):
    """LLM-like rows (softmax in the dtype, sums off by rounding), ``validate=False``: acceptance in
    [0, 1] and divergence >= 0, while matching the float64 solve of the rescaled rows."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(64, 200)) * 3
    p = torch.softmax(torch.as_tensor(base + rng.normal(size=base.shape) * 0.01), -1).to(dtype)
    q = torch.softmax(torch.as_tensor(base), -1).to(dtype)
    for budget in (0.0, 1e-9, 1.0):
        sol = solve(p, q, max_divergence=budget, divergence="kl", validate=False)
        assert (sol.acceptance >= 0).all() and (sol.acceptance <= 1).all()
        assert (sol.achieved_divergence >= 0).all()
        p64, q64 = p.double(), q.double()
        ref = solve(p64 / p64.sum(-1, keepdim=True), q64 / q64.sum(-1, keepdim=True), max_divergence=budget)
        tol = 1e-5 if dtype == torch.float32 else 1e-9
        torch.testing.assert_close(sol.acceptance.double(), ref.acceptance, atol=tol, rtol=0)
        pi = mentored_distribution(p64, q64, sol.a.double(), sol.b.double(), validate=False)
        d = f_divergence(pi / pi.sum(-1, keepdim=True), q64 / q64.sum(-1, keepdim=True), "kl", validate=False)
        assert (sol.achieved_divergence.double() <= budget + 2 * tol).all() and (d <= budget + 2 * tol).all()
