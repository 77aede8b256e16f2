"""The frontier (mdboost.ranking.frontier): MD dominates every heuristic point at equal per-position
divergence on random rows, exact values on a hand case, the MD curve, the plot."""

import math

import pytest
import torch

from mdboost.md.divergences import f_divergence
from mdboost.md.heuristics import Lenient
from mdboost.md.rules import Mentored, Threshold
from mdboost.ranking.frontier import DEFAULT_GRIDS, frontier, heuristic_rules, md_curve
from mdboost.ranking.plots import plot_frontier
from mdboost.ranking.speed import walltime_speedup


def _rows(n, vocab, seed, alpha=0.5):
    torch.manual_seed(seed)
    d = torch.distributions.Dirichlet(torch.full((vocab,), alpha, dtype=torch.float64))
    return d.sample((n,)), d.sample((n,))


@pytest.mark.parametrize("divergence", ["kl", "tv", "js"])
@pytest.mark.parametrize("seed", range(3))
def test_md_dominates_every_heuristic_point(divergence, seed):
    p, q = _rows(40, 12, seed, alpha=0.3 + 0.3 * seed)
    fr = frontier(p, q, divergence)
    assert len(fr.points) == 2 * sum(len(v) for v in DEFAULT_GRIDS.values())
    for pt in fr.points:
        assert pt.gap >= -1e-9, pt
        assert pt.gap_at_max >= pt.gap - 1e-9, pt
        assert pt.divergence_max >= pt.divergence_mean - 1e-12
    for mode, curve in fr.curves.items():  # MD's curve: acceptance non-decreasing in the budget
        acc = [pt.acceptance for pt in curve]
        assert all(b >= a - 1e-9 for a, b in zip(acc, acc[1:])), mode
        assert all(pt.divergence_max <= pt.value * (1 + 1e-6) + 1e-12 for pt in curve)


def test_hand_case_exact_values():
    """One position, p = (0.6, 0.4), q = (0.3, 0.7), tv: every number by hand."""
    p = torch.tensor([[0.6, 0.4]], dtype=torch.float64)
    q = torch.tensor([[0.3, 0.7]], dtype=torch.float64)
    grids = dict(lenient=(0.5,), typical=(), fuzzy=(), threshold=(0.5,), fly=())
    fr = frontier(p, q, "tv", drafting=("sampled", "greedy"), grids=grids, budgets=(0.0, 0.3), gamma=3,
                  cost_ratio=0.1)
    pts = {(pt.rule, pt.drafting): pt for pt in fr.points}
    # lenient l = 1/2, sampled: t = min(1, q / (p/2)) = (1, 1): pi = p, acceptance 1, TV(p, q) = 0.3;
    # MD at budget 0.3 reaches pi = p too: gap 0
    lenient = pts[("lenient", "sampled")]
    assert (lenient.acceptance, lenient.divergence_mean) == pytest.approx((1.0, 0.3), abs=1e-12)
    assert lenient.md_acceptance == pytest.approx(1.0, abs=1e-9)
    # lenient, greedy draft x = 0: t = min(1, 0.3 / 0.5) = 0.6, residual (q - delta_0 / 2)_+ = (0, 0.7): pi = (0.6, 0.4)
    greedy = pts[("lenient", "greedy")]
    assert (greedy.acceptance, greedy.divergence_mean) == pytest.approx((0.6, 0.3), abs=1e-12)
    # MD on the one-hot at TV budget D accepts q_x + D (the one-hot curve for tv): 0.6, no gap
    assert greedy.md_acceptance == pytest.approx(0.6, abs=1e-9)
    # SGLang c = 0.5, greedy: x = 0 accepted with 0.3 / 0.5 = 0.6, rejection emits token 1: TV = 0.3
    sglang = pts[("threshold", "greedy")]
    assert (sglang.acceptance, sglang.divergence_mean) == pytest.approx((0.6, 0.3), abs=1e-12)
    assert sglang.md_acceptance == pytest.approx(0.6, abs=1e-9)  # the threshold law is optimal here
    assert sglang.speedup == pytest.approx(float(walltime_speedup(0.6, 3, 0.1)), abs=1e-12)
    # MD's curves at budgets 0 and 0.3
    assert [pt.acceptance for pt in fr.curves["sampled"]] == pytest.approx([0.7, 1.0], abs=1e-9)
    assert [pt.acceptance for pt in fr.curves["greedy"]] == pytest.approx([0.3, 0.6], abs=1e-9)


def test_hand_case_with_a_gap():
    """Medusa's typical acceptance, greedy draft x = 0 with q_0 = 0.05 below its threshold 0.09:
    rejected surely, the target's argmax (token 1) is emitted: acceptance 0 at TV = 1 - 0.6 = 0.4,
    where MD on the one-hot accepts q_0 + 0.4 = 0.45."""
    p = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    q = torch.tensor([[0.05, 0.6, 0.35]], dtype=torch.float64)
    grids = dict(lenient=(), typical=(0.09,), fuzzy=(), threshold=(), fly=())
    (pt,) = frontier(p, q, "tv", drafting=("greedy",), grids=grids).points
    assert (pt.acceptance, pt.divergence_mean, pt.divergence_max) == pytest.approx((0.0, 0.4, 0.4), abs=1e-12)
    assert pt.md_acceptance == pytest.approx(0.45, abs=1e-9)
    assert pt.gap == pytest.approx(0.45, abs=1e-9)
    assert pt.md_acceptance_at_mean == pytest.approx(0.45, abs=1e-9)  # one position: the same budget
    assert pt.gap_at_max == pytest.approx(0.45, abs=1e-9)


def test_gap_at_mean_is_md_at_the_uniform_budget():
    p, q = _rows(30, 8, 5)
    fr = frontier(p, q, "kl", drafting=("sampled",), grids=dict(typical=(), fuzzy=(), threshold=(), fly=()))
    for pt in fr.points:
        md = Mentored(max_divergence=pt.divergence_mean).law(p, q)
        assert pt.md_acceptance_at_mean == pytest.approx(float(md.acceptance.mean()), abs=1e-9)
        law = Lenient(lenience=pt.value).law(p, q)
        assert pt.divergence_mean == pytest.approx(float(f_divergence(law.emitted, q, "kl").mean()), abs=1e-12)


def test_md_curve_points_are_the_mentored_rule():
    p, q = _rows(20, 6, 2)
    curve = md_curve(p, q, "js", drafting="greedy", budgets=(0.0, 0.1))
    law = Mentored(max_divergence=0.1, divergence="js", drafting="greedy").law(p, q)
    assert curve[1].acceptance == pytest.approx(float(law.acceptance.mean()), abs=1e-12)
    assert curve[0].acceptance == pytest.approx(float(q.gather(-1, p.argmax(-1, keepdim=True)).mean()), abs=1e-9)


def test_heuristic_rules_follow_the_grids():
    rules = heuristic_rules("kl", grids=dict(lenient=(0.5,), typical=(0.09,), fuzzy=(), threshold=(0.7,), fly=(0.3,)))
    assert [r.name for r in rules] == ["lenient", "typical", "threshold", "fly"]
    assert rules[1].delta == pytest.approx(0.3)  # Medusa's delta = sqrt(epsilon)
    assert rules[2] == Threshold(accept=0.7, drafting="sampled")
    with pytest.raises(ValueError, match="grids has unknown rules"):
        heuristic_rules(grids=dict(beam=(1,)))


def test_arguments_are_checked():
    p, q = _rows(4, 5, 0)
    with pytest.raises(ValueError, match="drafting must be"):
        frontier(p, q, drafting=("beam",))
    with pytest.raises(ValueError, match="give gamma and cost_ratio together"):
        frontier(p, q, gamma=3)
    with pytest.raises(ValueError, match="target_probs must be a \\[N, V\\] tensor"):
        frontier(p, q[0])
    with pytest.raises(ValueError, match="budgets must hold at least one budget"):
        md_curve(p, q, budgets=())


def test_plot_frontier_writes_a_png(tmp_path):
    p, q = _rows(10, 6, 1)
    fr = frontier(p, q, "kl")
    out = plot_frontier(fr, tmp_path / "frontier.png", title="a -> b")
    assert out.exists() and out.stat().st_size > 1000
    assert not math.isnan(fr.rows()[0]["gap"])
