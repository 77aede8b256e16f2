"""Boosting-aware MD in the ranking: at TV points, the boosted ensemble projected onto the TV optimal set."""

import numpy as np
import pytest
import torch

from mdboost.md.solve import acceptance_probability, solve
from mdboost.md.tv_set import geometric_mixture, project_tv_optimal
from mdboost.ranking.rank import PairRows, ScoreSettings, score_pair
from tests.test_ranking_pair import _member

V = 32
TV_ONLY = dict(divergences=("kl", "tv"), budgets=(0.0, 0.1, 0.3), orders=("target_first",))


def _complementary(n, seed=0):
    """The target is accurate on the first half of the vocabulary, the drafter on the second."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, V, generator=gen, dtype=torch.float64) * 2.5
    true = torch.multinomial(torch.softmax(z, -1), 1, generator=gen).squeeze(-1)
    half = torch.arange(V) < V // 2
    noise = torch.randn(2, n, V, generator=gen, dtype=torch.float64) * 3.0
    lq = z + torch.where(half, 0.1, 1.0) * noise[0]
    lp = z + torch.where(half, 1.0, 0.1) * noise[1]
    return lp, lq, true


def _score(lp, lq, true, k=4, full=True, **kw):
    d, t = _member("d", lp, true, k, full, 0.2), _member("t", lq, true, k, full, 1.0)
    return score_pair(PairRows(d, t, true.numpy()), V, settings=ScoreSettings(**TV_ONLY, **kw))


def _points(res):
    return {(r["divergence"], r["max_divergence"]): r for r in res.rows if r["is_best_gamma"]}


def test_boosted_projection_matches_a_direct_computation_and_keeps_the_tv_oracle():
    lp, lq, true = _complementary(300, seed=1)
    res = _score(lp, lq, true)
    p, q = torch.softmax(lp, -1), torch.softmax(lq, -1)
    idx = torch.arange(len(true))
    tv = 0.5 * (p - q).abs().sum(-1)
    for (f, budget), row in _points(res).items():
        if f != "tv":
            assert "nll_tv_boosted" not in row
            continue
        ref = geometric_mixture(p, q, row["boosted_scale"] * row["c_target"], row["boosted_scale"] * row["c_drafter"])
        pi = project_tv_optimal(p, q, budget, ref)
        assert row["nll_tv_boosted"] == pytest.approx(float(-pi[idx, true].log().mean()), rel=1e-9)
        assert row["nll_tv_clamp"] == row["nll_mentored"]
        assert row["nll_tv_boosted_reference"] == pytest.approx(float(-ref[idx, true].log().mean()), rel=1e-6)
        oracle = torch.clamp(1 - tv + budget, max=1.0)  # TV oracle: unchanged
        assert row["md_acceptance"] == pytest.approx(float(oracle.mean()), abs=1e-9)
        # the boosted projection is emitted at the same (optimal) acceptance, never lower
        assert torch.allclose(acceptance_probability(p, pi), oracle, atol=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_boosted_projection_never_has_lower_acceptance_than_the_clamp(seed):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(50, 40, generator=gen, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(50, 40, generator=gen, dtype=torch.float64) * 2, -1)
    for budget in (0.01, 0.1, 0.4, 2.0):
        clamp = solve(p, q, max_divergence=budget, divergence="tv").acceptance
        for c1, c2 in ((1.0, 0.0), (0.5, 0.5), (0.3, 1.2)):
            pi = project_tv_optimal(p, q, budget, geometric_mixture(p, q, c1, c2))
            assert bool((acceptance_probability(p, pi) >= clamp - 1e-12).all())


def test_complementary_pair_boosted_solution_beats_the_target():
    lp, lq, true = _complementary(3000)
    clamp = _points(_score(lp, lq, true))
    boosted = _points(_score(lp, lq, true, tv_mentor="boosted"))
    assert clamp[("tv", 0.3)]["nll_boosted_rescaled"] < clamp[("tv", 0.3)]["nll_target"]  # complementary indeed
    for key, row in boosted.items():
        other = clamp[key]
        # the speed side is the same whichever member of the optimal set is emitted
        for col in ("md_acceptance", "predicted_speedup", "best_gamma", "achieved_divergence"):
            assert row[col] == other[col]
        if key[0] != "tv":
            assert row["nll_mentored"] == other["nll_mentored"]
            continue
        assert row["mentor"] == "boosted" and other["mentor"] == "clamp"
        assert row["nll_mentored"] == row["nll_tv_boosted"] == other["nll_tv_boosted"]
        assert row["nll_tv_boosted"] < row["nll_target"] and row["beats_target_boosted"] and row["beats_target"]
        assert row["nll_tv_boosted"] < row["nll_tv_clamp"]  # better quality at identical acceptance


def test_top_k_support_gives_finite_columns():
    lp, lq, true = _complementary(200, seed=2)
    rows = _points(_score(lp, lq, true, k=6, full=False))
    for (f, budget), row in rows.items():
        if f == "tv":
            assert np.isfinite(row["nll_tv_boosted"]) and row["nll_tv_boosted"] > 0
    with pytest.raises(ValueError, match="tv_mentor"):
        ScoreSettings(tv_mentor="best")
