"""Speed model and diagnostics against hand-computed values and brute force."""

import itertools
import math

import numpy as np
import pytest
import torch

from mdboost.ranking.diagnostics import boost_coefficient, pair_diagnostics
from mdboost.ranking.speed import best_gamma, expected_tokens, walltime_speedup


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
