"""Speed model and diagnostics against hand-computed values and brute force."""

import itertools
import math

import numpy as np
import pytest
import torch

from mdboost.ranking.diagnostics import boost_coefficient, pair_diagnostics
from mdboost.ranking.speed import SpeedProfile, best_gamma, expected_solved, expected_tokens, walltime_speedup


def test_expected_tokens_hand_values():
    # alpha = 0.5, gamma = 3: 1 + .5 + .25 + .125
    assert expected_tokens(0.5, 3).item() == pytest.approx(1.875)
    assert expected_tokens(0.0, 5).item() == pytest.approx(1.0)
    assert expected_tokens(1.0, 4).item() == pytest.approx(5.0)
    assert expected_tokens(0.8, 0).item() == pytest.approx(1.0)


def test_speedup_hand_values():
    # Leviathan et al.: alpha=.8, gamma=5, c=.05 -> (1-.8^6)/(.2 * 1.25)
    expect = (1 - 0.8 ** 6) / (0.2 * 1.25)
    assert walltime_speedup(0.8, 5, 0.05).item() == pytest.approx(expect)
    assert walltime_speedup(1.0, 3, 0.0).item() == pytest.approx(4.0)
    assert walltime_speedup(0.0, 3, 0.5).item() == pytest.approx(1 / 2.5)


def test_best_gamma_matches_brute_force():
    for alpha, c in itertools.product([0.0, 0.2, 0.5, 0.8, 0.95, 1.0], [0.0, 0.01, 0.1, 0.3, 1.0]):
        speeds = [(1 - alpha ** (g + 1)) / ((1 - alpha) * (g * c + 1)) if alpha < 1 else (g + 1) / (g * c + 1)
                  for g in range(1, 9)]
        g, s = best_gamma(alpha, c, 1, 8)
        assert s.item() == pytest.approx(max(speeds))
        assert g.item() == 1 + int(np.argmax(speeds))


def test_best_gamma_batched_and_c_zero():
    alpha = torch.tensor([0.3, 0.9])
    g, s = best_gamma(alpha, torch.tensor([0.0, 0.0]), 1, 6)
    assert g.tolist() == [6, 6]  # free drafter: the longest draft wins whenever alpha > 0


@pytest.mark.parametrize("bad", [dict(alpha=1.2), dict(alpha=-0.1), dict(cost_ratio=-1.0)])
def test_speed_bad_input(bad):
    kw = dict(alpha=0.5, gamma=3, cost_ratio=0.1) | bad
    with pytest.raises(ValueError, match="alpha|cost_ratio"):
        walltime_speedup(**kw)
    with pytest.raises(ValueError, match="gamma"):
        best_gamma(0.5, 0.1, 3, 2)


def _brute(p, q):
    ratios = [qi / pi if pi > 0 else math.inf for pi, qi in zip(p, q) if pi != qi and (pi > 0 or qi > 0)]
    if not ratios:
        return math.nan, math.nan
    eps = min(abs(r - 1) for r in ratios)
    rho = min(min(ratios), 1 / max(ratios))
    return eps, rho


def test_diagnostics_against_brute_force():
    torch.manual_seed(0)  # Dirichlet.sample takes no generator
    p = torch.distributions.Dirichlet(torch.ones(7)).sample((20,))
    q = torch.distributions.Dirichlet(torch.ones(7)).sample((20,))
    p[0, 2] = 0.0  # p_i = 0 < q_i -> ratio inf -> rho 0
    q[1, 3] = 0.0  # q_i = 0 < p_i -> ratio 0 -> rho 0
    q[2] = p[2]  # identical -> NaN
    q[3, :3] = p[3, :3]  # some equal coordinates are ignored
    eps, rho = pair_diagnostics(p.double(), q.double())
    for i in range(20):
        e, r = _brute(p[i].double().tolist(), q[i].double().tolist())
        if math.isnan(e):
            assert eps[i].isnan() and rho[i].isnan()
        else:
            assert eps[i].item() == pytest.approx(e) and rho[i].item() == pytest.approx(r)
    assert rho[0] == 0 and rho[1] == 0
    assert ((rho[~rho.isnan()] >= 0) & (rho[~rho.isnan()] <= 1)).all()


def test_diagnostics_mask_and_shape():
    p = torch.tensor([[[0.5, 0.3, 0.2]]])
    q = torch.tensor([[[0.25, 0.6, 0.15]]])
    eps, rho = pair_diagnostics(p, q, mask=torch.tensor([[[True, True, False]]]))
    assert eps.shape == (1, 1)
    assert eps.item() == pytest.approx(0.5) and rho.item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="same shape"):
        pair_diagnostics(p, q[..., :2])


def test_boost_coefficient():
    assert boost_coefficient(torch.tensor(0.0), torch.tensor(0.0)).item() == 1.0
    assert boost_coefficient(torch.tensor(0.44), torch.tensor(0.0)).item() == pytest.approx(1.2)
    assert boost_coefficient(torch.tensor(0.0), torch.tensor(0.75)).item() == pytest.approx(2.0)
    assert math.isinf(boost_coefficient(torch.tensor(0.1), torch.tensor(1.0)).item())
    with pytest.raises(ValueError):
        boost_coefficient(torch.tensor(-0.1), torch.tensor(0.0))


# --------------------------------------------------------------- verification cost and MD overhead

def _hand_speedup(alpha, gamma, c, v, s):
    """Independent: expected tokens and solved positions as explicit sums over draft positions."""
    p_reach = [alpha ** i for i in range(gamma + 1)]  # position i is reached when i drafts were accepted
    tokens = sum(p_reach)  # one token per reached position (accepted draft, correction or bonus)
    solved = sum(p_reach[:gamma])  # MD solves every reached draft position, stopping at the first rejection
    return tokens / (gamma * c + v + s * solved)


@pytest.mark.parametrize("alpha,gamma,c,v,s", [(0.7, 4, 0.3, 1.65, 0.05), (0.0, 3, 0.1, 1.2, 0.5),
                                              (1.0, 5, 0.02, 2.0, 0.1), (0.45, 1, 0.0, 1.1, 0.0)])
def test_speedup_with_verify_cost_and_overhead_hand_values(alpha, gamma, c, v, s):
    got = walltime_speedup(alpha, gamma, c, verify_cost=v, md_overhead=s).item()
    assert got == pytest.approx(_hand_speedup(alpha, gamma, c, v, s), rel=1e-12)


def test_expected_solved_is_the_truncated_geometric_sum():
    for alpha, gamma in itertools.product([0.0, 0.3, 0.9, 1.0], range(0, 7)):
        assert expected_solved(alpha, gamma).item() == pytest.approx(sum(alpha ** i for i in range(gamma)))


def test_unit_verify_cost_and_no_overhead_is_the_old_model():
    alpha = torch.linspace(0, 1, 11, dtype=torch.float64)
    for gamma, c in itertools.product(range(1, 7), [0.0, 0.05, 0.4]):
        old = walltime_speedup(alpha, gamma, c)
        new = walltime_speedup(alpha, gamma, c, verify_cost=1.0, md_overhead=0.0)
        torch.testing.assert_close(new, old, rtol=0, atol=0)
        g_old, s_old = best_gamma(alpha, c, 1, 6)
        g_new, s_new = best_gamma(alpha, c, 1, 6, verify_costs=[1.0] * 7, md_overhead=0.0)
        assert torch.equal(g_old, g_new) and torch.equal(s_old, s_new)


def test_best_gamma_uses_the_table_and_matches_brute_force():
    table = [1.0, 1.2, 1.5, 1.9, 2.4, 3.0, 3.7]
    for alpha, c, s in itertools.product([0.3, 0.7, 0.95], [0.0, 0.05, 0.2], [0.0, 0.1]):
        speeds = [_hand_speedup(alpha, g, c, table[g], s) for g in range(1, 7)]
        g, sp = best_gamma(alpha, c, 1, 6, verify_costs=table, md_overhead=s)
        assert g.item() == 1 + int(np.argmax(speeds)) and sp.item() == pytest.approx(max(speeds))


def test_best_gamma_shrinks_when_verification_gets_dearer():
    alpha, c = 0.8, 0.05
    flat, _ = best_gamma(alpha, c, 1, 8)
    steep, _ = best_gamma(alpha, c, 1, 8, verify_costs=[1.0 + 0.3 * g for g in range(9)])
    steeper, _ = best_gamma(alpha, c, 1, 8, verify_costs=[1.0 + 1.0 * g for g in range(9)])
    assert flat.item() > steep.item() > steeper.item()


def test_md_overhead_lowers_speed_and_gamma():
    g0, s0 = best_gamma(0.8, 0.05, 1, 8)
    g1, s1 = best_gamma(0.8, 0.05, 1, 8, md_overhead=0.3)
    assert s1.item() < s0.item() and g1.item() <= g0.item()


@pytest.mark.parametrize("kwargs,name", [
    (dict(verify_cost=0.0), "verify_cost"), (dict(verify_cost=float("nan")), "verify_cost"),
    (dict(md_overhead=-0.1), "md_overhead"), (dict(md_overhead=float("inf")), "md_overhead"),
    (dict(cost_ratio=float("nan")), "cost_ratio"), (dict(gamma=-1), "gamma")])
def test_walltime_speedup_bad_inputs_name_the_argument(kwargs, name):
    args = dict(alpha=0.5, gamma=3, cost_ratio=0.1) | kwargs
    with pytest.raises(ValueError, match=name):
        walltime_speedup(**args)


@pytest.mark.parametrize("table", [[1.0, 1.2], [1.1, 1.2, 1.3, 1.4], [1.0, -1.0, 1.2, 1.3], [[1.0, 1.2, 1.3, 1.4]],
                                   [1.0, float("inf"), 1.3, 1.4]])
def test_best_gamma_bad_table_names_verify_costs(table):
    with pytest.raises(ValueError, match="verify_costs"):
        best_gamma(0.5, 0.1, 1, 3, verify_costs=table)
    with pytest.raises(ValueError, match="md_overhead"):
        best_gamma(0.5, 0.1, 1, 3, md_overhead=-1.0)


def test_speed_profile_validates():
    assert SpeedProfile().verify_cost is None and SpeedProfile().md_overhead == 0.0
    with pytest.raises(ValueError, match="verify_costs"):
        SpeedProfile(verify_cost=(2.0, 3.0))
    with pytest.raises(ValueError, match="md_overhead"):
        SpeedProfile(md_overhead=-0.5)


def test_md_solve_modes():
    alpha, sd, gamma = 0.8, 0.6, 4
    reached = sum(alpha ** i for i in range(gamma))
    assert expected_solved(alpha, gamma, md_solve="needed", sd_acceptance=sd).item() == pytest.approx((1 - sd) * reached)
    assert expected_solved(alpha, gamma, md_solve="all").item() == gamma
    s_needed = walltime_speedup(alpha, gamma, 0.1, verify_cost=1.3, md_overhead=0.2, md_solve="needed", sd_acceptance=sd)
    tokens = sum(alpha ** i for i in range(gamma + 1))
    assert s_needed.item() == pytest.approx(tokens / (gamma * 0.1 + 1.3 + 0.2 * (1 - sd) * reached))
    g, s = best_gamma(alpha, 0.1, 1, 6, md_overhead=0.2, md_solve="needed", sd_acceptance=sd)
    brute = [sum(alpha ** i for i in range(k + 1)) / (k * 0.1 + 1 + 0.2 * (1 - sd) * sum(alpha ** i for i in range(k)))
             for k in range(1, 7)]
    assert g.item() == 1 + int(np.argmax(brute)) and s.item() == pytest.approx(max(brute))
    with pytest.raises(ValueError, match="sd_acceptance"):
        expected_solved(alpha, gamma, md_solve="needed")
    with pytest.raises(ValueError, match="md_solve"):
        expected_solved(alpha, gamma, md_solve="some")
