"""Every route of the exact solve against its statement, ``mdboost.md.solve.reference``.

The router (``mdboost.md._router``) picks one of several routes for ``solve``; each is forced here
by the explicit ``route=`` argument and run on the same cases: several generators, the primal
and the dual, zeros in ``p`` and in ``q``, small and bucket-sized vocabularies, budgets from 0 to
beyond the curve's end. The reference itself is checked against the independent numpy oracle
of ``tests/test_md_reference.py``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from mdboost.md import _router
from mdboost.md.divergences import resolve
from mdboost.md.solve import _solve, mentored_distribution, reference, solve
from tests.test_md_reference import NAMES, random_pair, ref_dual, ref_primal

DIVERGENCES = ["kl", "rkl", "tv", "hellinger", "alpha:1.5"]
BUDGETS = [0.0, 1e-9, 0.05, 50.0]  # zero, tiny, medium, beyond the curve's end
TARGETS = [0.0, 0.6, 0.9, 1.0]  # below SD's acceptance, inside, the end (clipped)
CASES = [("plain", 5), ("zeros", 5), ("plain", 50), ("zeros", 50), ("plain", 5000), ("zeros", 5000)]
BATCH_ROUTES = (_router.BUCKETED_BATCH, _router.SORTED, _router.REFERENCE)
TOL = 1e-9


@functools.lru_cache(maxsize=None)
def _pair(kind, n):  # float64 [len(BUDGETS), n] x2: the same pair on every row
    rng = np.random.default_rng(n + len(kind))
    zeros = dict(zeros_p=max(1, n // 5), zeros_q=max(1, n // 7)) if kind == "zeros" else {}
    p, q = random_pair(rng, n, **zeros)
    rows = len(BUDGETS)
    return torch.from_numpy(p)[None].expand(rows, n).clone(), torch.from_numpy(q)[None].expand(rows, n).clone()


@functools.lru_cache(maxsize=None)
def _reference(kind, n, name, dual):
    p, q = _pair(kind, n)
    values = torch.tensor(TARGETS if dual else BUDGETS, dtype=torch.float64)
    return p, q, values, reference(p, q, values, dual, name)


def _assert_matches(sol, ref, p, q, what):
    """Acceptance, ``D_f`` and the distribution ``pi`` itself within :data:`TOL` of the reference."""
    a, b, acc, value, sd = ref
    torch.testing.assert_close(sol.acceptance, acc, atol=TOL, rtol=0, msg=what)
    torch.testing.assert_close(sol.sd_acceptance, sd, atol=TOL, rtol=0, msg=what)
    torch.testing.assert_close(sol.achieved_divergence, value, atol=TOL, rtol=TOL, msg=what)
    pi = mentored_distribution(p, q, sol.a, sol.b)
    pi_ref = mentored_distribution(p, q, a, b)
    assert float((pi - pi_ref).abs().sum(-1).max()) <= TOL, what


@pytest.mark.parametrize("kind,n", CASES)
@pytest.mark.parametrize("name", DIVERGENCES)
@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("route", _router.ROUTES)
def test_every_route_equals_the_reference(route, dual, name, kind, n):
    p, q, values, ref = _reference(kind, n, name, dual)
    if route in BATCH_ROUTES:
        kwargs = dict(min_acceptance=values) if dual else dict(max_divergence=values)
        _assert_matches(_solve(p, q, divergence=name, route=route, **kwargs), ref, p, q, (route, name))
        return
    if dual or resolve(name).g_float is None:  # the one-row routes solve the primal of a built-in generator
        with pytest.raises(ValueError, match=route):
            _solve(p[0], q[0], *((None, 0.5) if dual else (0.05,)), divergence=name, route=route)
        return
    for i, budget in enumerate(BUDGETS):
        sol = _solve(p[i], q[i], float(budget), divergence=name, route=route)
        _assert_matches(sol, [x[i] for x in ref], p[i], q[i], (route, name, budget))


@pytest.mark.parametrize("kind,n", [("plain", 50), ("zeros", 5000)])
def test_the_picked_route_is_the_forced_one_bit_for_bit(kind, n):
    """``solve`` runs the route :func:`mdboost.md._router.pick` names: the same floats as forcing it."""
    p, q = _pair(kind, n)
    for args in ((p[1], q[1]), (p, q)):
        route = _router.pick(*args, 0.05, True)
        got, forced = solve(*args, max_divergence=0.05), _solve(*args, 0.05, route=route)
        for field in ("a", "b", "acceptance", "achieved_divergence"):
            assert torch.equal(getattr(got, field), getattr(forced, field)), (route, field)


def test_a_route_that_cannot_solve_the_request_is_refused():
    p, q = _pair("plain", 50)
    with pytest.raises(ValueError, match="route must be one of"):
        _solve(p, q, 0.05, route="fast")
    with pytest.raises(ValueError, match="mode='exact' only"):
        _solve(p, q, 0.05, mode="bound", route=_router.BUCKETED_BATCH)
    with pytest.raises(ValueError, match="one CPU row"):
        _solve(p, q, 0.05, route=_router.SCALAR_ROW)  # a batch


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", NAMES)
def test_the_reference_equals_the_independent_numpy_oracle(seed, name):
    rng = np.random.default_rng(seed)
    p, q = random_pair(rng, 9, zeros_p=2, zeros_q=1) if seed else random_pair(rng, 9)
    budgets = [0.0, 1e-4, 0.02, 0.3, 5.0]
    targets = [0.0, 0.5, 0.8, 0.95, 1.0]
    pt, qt = (torch.from_numpy(x)[None].expand(5, -1) for x in (p, q))
    acc = reference(pt, qt, torch.tensor(budgets, dtype=torch.float64), False, name)[2]
    want = [ref_primal(p, q, budget, name) for budget in budgets]
    torch.testing.assert_close(acc, torch.tensor(want, dtype=torch.float64), atol=1e-9, rtol=0)
    a, b, acc = reference(pt, qt, torch.tensor(targets, dtype=torch.float64), True, name)[:3]
    want = torch.tensor([ref_dual(p, q, target) for target in targets], dtype=torch.float64)
    torch.testing.assert_close(acc, want[:, 2], atol=1e-12, rtol=0)
    torch.testing.assert_close(b, want[:, 1], atol=1e-9, rtol=0)
    torch.testing.assert_close(torch.log1p(a), torch.log1p(want[:, 0]), atol=1e-9, rtol=0)
