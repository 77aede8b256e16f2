"""score_pair and the ranking rule, cross-checked against direct full-vocabulary computations."""

import math

import numpy as np
import pytest
import torch

from mdboost.md.solve import solve
from mdboost.ranking.boosting import CachedLogitsHypothesis, ProposalHypothesis
from mdboost.ranking.rank import PairRows, PairSide, ScoreSettings, rank_rows, score_pair
from mdboost.ranking.scores import alone_rows, score_rows
from mdboost.ranking.speed import best_gamma, walltime_speedup
from mdboost.ranking.support import rows_from_logits, rows_from_proposals

V, N = 32, 40
MD = ScoreSettings(divergences=("kl", "tv"), budgets=(0.0, 0.1, 0.5))


def _member(name, logits, true, k, full, cost):
    rows = rows_from_logits(logits, true, k, keep_full=full)
    idx = torch.arange(len(true))
    hyp = CachedLogitsHypothesis(true, logits[idx, true], logits.sum(-1), V, full_logits=logits if full else None,
                                 topk_ids=rows.ids, topk_logits=logits.gather(-1, rows.ids), name=name)
    return PairSide(name, rows, hyp, cost)


@pytest.fixture
def pair():
    gen = torch.Generator().manual_seed(1)
    lq = torch.randn(N, V, generator=gen, dtype=torch.float64) * 2
    lp = lq + torch.randn(N, V, generator=gen, dtype=torch.float64)
    true = torch.multinomial(torch.softmax(lq, -1), 1, generator=gen).squeeze(-1)
    return lp, lq, true


def test_score_pair_full_matches_direct(pair):
    lp, lq, true = pair
    d, t = _member("d", lp, true, 4, True, 0.2), _member("t", lq, true, 4, True, 1.0)
    settings = ScoreSettings(divergences=("kl", "tv"), budgets=(0.0, 0.1, 0.5), gamma_min=1, gamma_max=6)
    res = score_pair(PairRows(d, t, true.numpy()), V, settings=settings)
    # budget 0 once (plain SD, divergence "none"), then each f at each budget > 0; every gamma 1..6
    assert [(p.divergence, p.max_divergence) for p in res.points] == [
        ("none", 0.0), ("kl", 0.1), ("kl", 0.5), ("tv", 0.1), ("tv", 0.5)]
    assert len(res.rows) == 5 * 6 and [r["gamma"] for r in res.rows[:6]] == [1, 2, 3, 4, 5, 6]
    assert [(r["rule"], r["gamma"]) for r in res.alone_rows] == [("alone", 0)]  # the drafter alone: no drafts
    p, q = torch.softmax(lp, -1), torch.softmax(lq, -1)
    sd = torch.minimum(p, q).sum(-1)
    idx = torch.arange(N)
    for row in res.rows:
        assert row["sd_acceptance"] == pytest.approx(float(sd.mean()))
        f = "kl" if row["divergence"] == "none" else row["divergence"]
        sol = solve(p, q, max_divergence=row["max_divergence"], divergence=f)
        assert row["md_acceptance"] == pytest.approx(float(sol.acceptance.mean()), abs=1e-9)
        assert row["acceptance_gain"] == pytest.approx(row["md_acceptance"] - row["sd_acceptance"])
        g, s = best_gamma(float(sol.acceptance.mean()), 0.2, 1, 6)
        assert row["best_gamma"] == int(g) and row["is_best_gamma"] == (row["gamma"] == int(g))
        at_gamma = walltime_speedup(float(sol.acceptance.mean()), row["gamma"], 0.2)
        assert row["predicted_speedup"] == pytest.approx(float(at_gamma))
        if row["is_best_gamma"]:
            assert row["predicted_speedup"] == pytest.approx(float(s))
        pi = torch.maximum((1 - sol.b[:, None]) * q, torch.minimum(p, (1 + sol.a[:, None]) * q))
        assert row["nll_mentored"] == pytest.approx(float(-pi[idx, true].log().mean()))
        k = torch.sqrt((1 + sol.a) / (1 - sol.b))
        assert row["k_median"] == pytest.approx(float(np.quantile(k.numpy(), 0.5, method="nearest")))
        assert row["nll_target"] == pytest.approx(float(-q[idx, true].log().mean()))
        assert row["nll_drafter"] == pytest.approx(float(-p[idx, true].log().mean()))
        boosted = torch.log_softmax(row["c_target"] * lq + row["c_drafter"] * lp, -1)
        assert row["nll_boosted"] == pytest.approx(float(-boosted[idx, true].mean()))
        s = row["boosted_scale"]
        scaled = lambda x: float(-torch.log_softmax(x * (row["c_target"] * lq + row["c_drafter"] * lp), -1)[idx, true].mean())
        assert row["nll_boosted_rescaled"] == pytest.approx(scaled(s), rel=1e-6)
        assert row["nll_boosted_rescaled"] <= min(scaled(s * 0.9), scaled(s * 1.1), scaled(1.0)) + 1e-9
        assert row["boosting_advantage"] == pytest.approx(
            row["mu_target"] ** 2 + row["mu_drafter"] ** 2)
        assert row["margin_risk_0"] <= row["margin_bound_0"] + 1e-12
        if row["max_divergence"] == 0:
            assert row["md_acceptance"] == pytest.approx(row["sd_acceptance"])
            assert row["nll_mentored"] == pytest.approx(row["nll_target"])
    eps = np.abs(q.numpy() / p.numpy() - 1).min(-1)  # p, q strictly positive and all different
    ratio = q.numpy() / p.numpy()
    rho = np.minimum(ratio.min(-1), 1 / ratio.max(-1))
    assert res.rows[0]["eps_pq_median"] == pytest.approx(float(np.quantile(eps, 0.5, method="nearest")))
    assert res.rows[0]["rho_pq_median"] == pytest.approx(float(np.quantile(rho, 0.5, method="nearest")))
    # acceptance grows with the budget
    for div in ("kl", "tv"):
        accs = [r["md_acceptance"] for r in res.rows if r["divergence"] == div]
        assert accs == sorted(accs)


def test_score_pair_topk_within_tail_of_full(pair):
    lp, lq, true = pair
    full = score_pair(PairRows(_member("d", lp, true, 8, True, 0.2), _member("t", lq, true, 8, True, 1.0), true.numpy()),
                      V, settings=MD)
    topk = score_pair(PairRows(_member("d", lp, true, 8, False, 0.2), _member("t", lq, true, 8, False, 1.0), true.numpy()),
                      V, settings=MD)
    (a,), (b,) = full.alone_rows, topk.alone_rows  # the drafter alone: TV(p, q) within the tail too
    assert abs(a["achieved_divergence"] - b["achieved_divergence"]) <= b["tail_mass"]
    for a, b in zip(full.rows, topk.rows):
        assert abs(a["md_acceptance"] - b["md_acceptance"]) <= b["tail_mass"] + 1e-9
        assert a["sd_acceptance"] - b["sd_acceptance"] <= b["tail_mass"] + 1e-9
        assert a["nll_target"] == pytest.approx(b["nll_target"])
        assert a["mu_target"] == pytest.approx(b["mu_target"])


def test_score_pair_ngram(pair):
    _, lq, true = pair
    props = torch.where(torch.arange(N) % 4 == 0, -1, torch.where(torch.arange(N) % 2 == 0, true, (true + 1) % V))
    d = PairSide("ngram:2", rows_from_proposals(props, true), ProposalHypothesis(props.numpy(), V), 0.0)
    t = _member("t", lq, true, V - 1, False, 1.0)
    res = score_pair(PairRows(d, t, true.numpy()), V, settings=MD)
    q = torch.softmax(lq, -1)
    ok = props >= 0
    q_x = torch.where(ok, q[torch.arange(N), props.clamp_min(0)], torch.zeros(N, dtype=torch.float64))
    row0 = res.rows[0]
    assert row0["sd_acceptance"] == pytest.approx(float(q_x.mean()))
    assert row0["proposal_rate"] == pytest.approx(float(ok.double().mean()))
    assert math.isinf(row0["nll_drafter"])
    for row in res.rows:  # MD acceptance of a one-hot draft is min(1, (1 + a) q_x) on proposing rows
        acc = res.md_acceptance[(row["divergence"], row["max_divergence"])]
        assert np.all(acc[~ok.numpy()] == 0)
        assert math.isfinite(row["nll_mentored"])
    assert row0["cost_ratio"] == 0.0 and row0["best_gamma"] == 8  # free drafter: longest draft


def test_rows_are_the_named_results(pair):
    """Each CSV row is its PointScore and the pair's stats; the *_iid columns are the i.i.d. choice."""
    lp, lq, true = pair
    res = score_pair(PairRows(_member("d", lp, true, 4, True, 0.2), _member("t", lq, true, 4, True, 1.0), true.numpy()),
                     V, settings=MD, acceptance_source="custom")
    rows, (alone,) = score_rows(res), alone_rows(res)
    gammas = list(MD.gammas)
    # the drafter alone, last: 1 / c without a layout (no prompts to prefill), its own NLL, TV(p, q)
    tv = 0.5 * (torch.softmax(lp, -1) - torch.softmax(lq, -1)).abs().sum(-1)
    assert (alone["rule"], alone["gamma"], alone["divergence"], alone["engines"]) == ("alone", 0, "tv", "mdboost")
    assert alone["predicted_speedup"] == pytest.approx(1 / 0.2) and math.isnan(alone["predicted_speedup_lo"])
    assert alone["max_divergence"] == pytest.approx(float(tv.max())) and alone["drafter_share"] == 1.0
    assert alone["achieved_divergence"] == pytest.approx(float(tv.mean()))
    assert alone["nll_mentored"] == alone["nll_drafter"] == res.stats.nll_drafter
    assert [(r["divergence"], r["max_divergence"], r["gamma"]) for r in rows] == [
        (p.divergence, p.max_divergence, g) for p in res.points for g in gammas]
    for i, row in enumerate(rows):
        point, j = res.points[i // len(gammas)], i % len(gammas)
        assert row["md_acceptance"] == pytest.approx(float(point.acceptance.mean()))
        assert row["best_gamma"] == row["best_gamma_iid"] == point.iid.gamma == point.gamma  # no layout: no process
        assert row["predicted_speedup"] == row["predicted_speedup_iid"] == point.iid.speedups[j]
        assert math.isnan(row["predicted_speedup_lo"]) and row["temperature"] == MD.temperature
        assert row["nll_mentored"] == point.nll_mentored and "engine_acceptance" not in row
        assert row["sd_best_gamma"] == row["sd_best_gamma_iid"] == res.sd_iid.gamma
        assert row["nll_target"] == res.stats.nll_target and row["acceptance_source"] == "custom"
    assert res.sd_acceptance.shape == (N,) and res.margins is res.stats.boost.margins


def test_pair_rows_and_settings_reject_bad_input(pair):
    lp, lq, true = pair
    d, t = _member("d", lp, true, 4, False, 0.2), _member("t", lq, true, 4, False, 1.0)
    with pytest.raises(ValueError, match="same positions"):
        PairRows(d, t, true.numpy()[:-1])
    for bad, name in (({"divergences": ("kl", "bogus")}, "divergences"), ({"md_solve": "some"}, "md_solve"),
                      ({"gamma_min": 3, "gamma_max": 2}, "gamma_min"), ({"n_estimators": 1}, "n_estimators")):
        with pytest.raises(ValueError, match=name):
            ScoreSettings(**bad)
    assert ScoreSettings(budgets=(0, 1)).budgets == (0.0, 1.0)


def test_rank_rule():
    base = dict(nll_target=2.0, md_acceptance=0.5)
    rows = [
        dict(base, name="a", nll_mentored=2.0, predicted_speedup=1.5, boosting_advantage=0.1),
        dict(base, name="b", nll_mentored=2.2, predicted_speedup=3.0, boosting_advantage=0.1),  # too lossy
        dict(base, name="c", nll_mentored=2.04, predicted_speedup=1.5, boosting_advantage=0.3),  # tie -> A
        dict(base, name="d", nll_mentored=1.9, predicted_speedup=2.0, boosting_advantage=0.0),
    ]
    ranked = rank_rows(rows, nll_tolerance=0.05)
    assert [r["name"] for r in ranked] == ["d", "c", "a", "b"]
    assert [r["rank"] for r in ranked] == [1, 2, 3, 4]
    assert [r["quality_ok"] for r in ranked] == [True, True, True, False]
    assert [r["name"] for r in rank_rows(rows, nll_tolerance=0.5)][0] == "b"
    with pytest.raises(ValueError, match="nll_tolerance"):
        rank_rows(rows, -1)


def test_cached_hypotheses_bound_the_estimators_row_indices():
    """The ranking's cached hypotheses expose ``n_rows``, so a pool-mode estimator refuses row
    indices outside the cache (a negative index would otherwise wrap around silently)."""
    from mdboost import SelfNormalizedBoostClassifier

    rng = np.random.default_rng(0)
    true = rng.integers(0, 6, 12)
    logits = rng.normal(size=(12, 6))
    pool = [CachedLogitsHypothesis(true, logits[np.arange(12), true], logits.sum(-1), 6, full_logits=logits),
            ProposalHypothesis(true.copy(), 6)]
    assert [h.n_rows for h in pool] == [12, 12]
    clf = SelfNormalizedBoostClassifier(pool=pool, n_estimators=2).fit(np.arange(12)[:, None], true)
    for bad in ([[-1]], [[12]]):
        with pytest.raises(ValueError, match="X"):
            clf.predict(np.array(bad))
