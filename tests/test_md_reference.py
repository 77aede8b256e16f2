"""Brute-force numpy reference for f-MD (independent of mdboost.md), and checks of the reference.

The reference walks the clamp curve by the excess mass m (acceptance = 1 - m): for a given m,
``a`` solves ``E(a) = m`` and ``b`` solves ``F(b) = m`` by bisection, and ``D_f`` is evaluated on
the full clamp distribution (O(n) per step). The primal is then a bisection on m.
"""

from __future__ import annotations

import numpy as np
import pytest

ITERS = 52


def _xlogx(z):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(z > 0, z * np.log(np.where(z > 0, z, 1.0)), 0.0)


def _alpha(a):
    e = (1 + a) / 2
    c = 4 / (1 - a * a)

    def f(z):
        with np.errstate(divide="ignore"):
            return c * (1 - np.power(z, e))

    return f, (np.inf if e > 1 else 0.0)


def _safe(fn):
    def f(z):
        with np.errstate(divide="ignore", invalid="ignore"):
            return fn(np.asarray(z, dtype=np.float64))

    return f


REF = {
    "kl": (_xlogx, np.inf),
    "rkl": (_safe(lambda z: np.where(z > 0, -np.log(np.where(z > 0, z, 1.0)), np.inf)), 0.0),
    "hellinger": (_safe(lambda z: (np.sqrt(z) - 1) ** 2), 1.0),
    "pearson": (_safe(lambda z: (z - 1) ** 2), np.inf),
    "neyman": (_safe(lambda z: np.where(z > 0, (z - 1) ** 2 / np.where(z > 0, z, 1.0), np.inf)), 1.0),
    "tv": (_safe(lambda z: np.abs(z - 1) / 2), 0.5),
    "js": (_safe(lambda z: 0.5 * (_xlogx(z) - (1 + z) * np.log((1 + z) / 2))), np.log(2) / 2),
    "alpha:1.5": _alpha(1.5),
    "alpha:-1.5": _alpha(-1.5),
}
NAMES = list(REF)


def ref_divergence(pi, q, name):
    f, slope = REF[name]
    pi, q = np.asarray(pi, np.float64), np.asarray(q, np.float64)
    pos = q > 0
    z = np.where(pos, pi / np.where(pos, q, 1.0), 1.0)
    terms = np.where(pos, q * f(z), 0.0)
    with np.errstate(invalid="ignore"):
        out = np.where(~pos & (pi > 0), pi * slope, 0.0)
    return float(terms.sum() + out.sum())


def clamp(p, q, a, b):
    return np.maximum((1 - b) * q, np.minimum(p, (1 + a) * q))


def excess(p, q, a):
    return float(np.maximum(p - (1 + a) * q, 0).sum())


def deficit(p, q, b):
    return float(np.maximum((1 - b) * q - p, 0).sum())


def ends(p, q):
    """(TV, m_end, a_max): the curve runs from m = TV (pi = q) to m = p(q = 0)."""
    tv = 0.5 * float(np.abs(p - q).sum())
    m_end = float(p[q == 0].sum())
    pos = q > 0
    a_max = max(float((p[pos] / q[pos]).max()) - 1, 0.0) if pos.any() else 0.0
    return tv, min(m_end, tv), a_max


def point(p, q, m):
    """(a, b) on the curve with E(a) = F(b) = m, by bisection."""
    tv, m_end, a_max = ends(p, q)
    if m >= tv:
        return 0.0, 0.0
    lo, hi = 0.0, np.log1p(a_max)  # E decreasing in a; bisect on log(1 + a) (ratios span decades)
    for _ in range(ITERS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excess(p, q, np.expm1(mid)) > m else (lo, mid)
    a = float(np.expm1(hi))
    lo, hi = 0.0, 1.0
    for _ in range(ITERS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if deficit(p, q, mid) > m else (lo, mid)
    return a, hi


def curve_divergence(p, q, m, name):
    a, b = point(p, q, m)
    return ref_divergence(clamp(p, q, a, b), q, name)


def ref_primal(p, q, budget, name):
    """Max acceptance subject to D_f <= budget: bisection on m with full D_f per step."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    tv, m_end, _ = ends(p, q)
    if budget <= 0:
        return 1 - tv
    if curve_divergence(p, q, m_end, name) <= budget:
        return 1 - m_end
    lo, hi = m_end, tv  # D(lo) > budget >= D(hi)
    for _ in range(ITERS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if curve_divergence(p, q, mid, name) > budget else (lo, mid)
    return 1 - hi


def ref_dual(p, q, min_acceptance):
    """(a, b, acceptance) of the dual: the curve point with acceptance P (clipped to the curve)."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    tv, m_end, _ = ends(p, q)
    m = min(max(1 - min_acceptance, m_end), tv)
    a, b = point(p, q, m)
    return a, b, 1 - m


def random_pair(rng, n, concentration=1.0, zeros_p=0, zeros_q=0, peaked=False):
    p = rng.dirichlet(np.full(n, concentration))
    q = rng.dirichlet(np.full(n, concentration))
    if peaked:
        p = rng.dirichlet(np.full(n, 0.02))
    p[rng.choice(n, zeros_p, replace=False)] = 0
    q[rng.choice(n, zeros_q, replace=False)] = 0
    if p.sum() == 0:
        p[0] = 1
    if q.sum() == 0:
        q[-1] = 1
    return p / p.sum(), q / q.sum()


# ---------------------------------------------------------------- checks of the reference itself
@pytest.mark.parametrize("seed", range(5))
def test_reference_tv_oracle(seed):
    rng = np.random.default_rng(seed)
    p, q = random_pair(rng, 12)
    tv = 0.5 * np.abs(p - q).sum()
    for budget in [0.0, 0.3 * tv, 0.9 * tv, 2.0]:
        assert ref_primal(p, q, budget, "tv") == pytest.approx(min(1, 1 - tv + budget), abs=1e-10)


@pytest.mark.parametrize("seed", range(5))
def test_reference_points_are_normalized_clamps(seed):
    rng = np.random.default_rng(seed)
    p, q = random_pair(rng, 9, zeros_p=2, zeros_q=1)
    tv, m_end, _ = ends(p, q)
    for m in np.linspace(m_end, tv, 7):
        a, b = point(p, q, m)
        pi = clamp(p, q, a, b)
        assert pi.sum() == pytest.approx(1.0, abs=1e-12)
        assert np.minimum(pi, p).sum() == pytest.approx(1 - m, abs=1e-12)


def test_reference_divergences_match_closed_forms():
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.2, 0.3, 0.5])
    assert ref_divergence(p, q, "kl") == pytest.approx(float(np.sum(p * np.log(p / q))))
    assert ref_divergence(p, q, "rkl") == pytest.approx(float(np.sum(q * np.log(q / p))))
    assert ref_divergence(p, q, "pearson") == pytest.approx(float(np.sum((p - q) ** 2 / q)))
    assert ref_divergence(p, q, "neyman") == pytest.approx(float(np.sum((p - q) ** 2 / p)))
    assert ref_divergence(p, q, "tv") == pytest.approx(0.5 * float(np.abs(p - q).sum()))
    m = (p + q) / 2
    js = 0.5 * np.sum(p * np.log(p / m)) + 0.5 * np.sum(q * np.log(q / m))
    assert ref_divergence(p, q, "js") == pytest.approx(float(js))
