"""One CPU row on the linear-time path: its shortcuts give the values of the batched steps exactly.

``mdboost.md._buckets.solve_one`` (``solve`` on one row of ``V >= 4096``) builds the reduced pair
of the row directly and hands it to the Python-float search of ``mdboost.md._scalar`` (its own
sort and sums, ``_scalar_rows.reduced_row``); the batched steps build ``Breakpoints`` on the reduced
pair and search there. The input check hands its float64 row sums to the rescaling
(``_checks.checked_pair``), and the numpy namespace evaluates generators by ``Divergence.g_numpy``.
Each shortcut must give the same floats as the route it replaces.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mdboost.md import _buckets, _router
from mdboost.md._checks import check_budget, checked_pair
from mdboost.md._histogram import rows_of
from mdboost.md.divergences import GENERATORS, alpha, resolve
from mdboost.md.solve import MDSolution, solve
from tests.test_md_buckets import _llm_rows

BUDGETS = (0.0, 1e-13, 1e-6, 1e-3, 0.05, 1.0, 30.0, math.inf)


def _rows():
    for dtype in (torch.float32, torch.float64):
        p, q = _llm_rows(2, 6000, 7, dtype)
        yield p[:1], q[:1]
        pz, qz = p[1:].clone(), q[1:].clone()
        qz[0, :40], pz[0, 40:80], pz[0, 80:90], qz[0, 80:90] = 0, 0, 0, 0  # q = 0, p = 0, both 0
        yield pz / pz.sum(), qz / qz.sum()
    q = _llm_rows(1, 5000, 8)[1]
    yield q * (1 + 1e-7 * torch.linspace(-1, 1, 5000, dtype=torch.float64)), q  # ratios in two buckets: sorted


def _batched_steps(p, q, budget: float, div, normalize: bool):
    """``(a, b, acceptance, D_f, tv)`` of the batched steps on a batch of one: the reduced pair's
    ``Breakpoints`` and ``_search.primal_point``, then the sorted fallback where flagged."""
    col = torch.full((1, 1), budget, dtype=torch.float64)
    prep, reduced = _buckets.prepare_primal(p, q, col, div, normalize)
    point, value = _buckets._finish_primal(prep.bp, reduced, div, prep.delta)
    out = [*point, torch.where(col <= 0, 0.0, value), prep.tv]
    if bool(prep.fallback[0]):
        out = list(_buckets.sorted_solve(p, q, col, div, False, normalize))
    return [float(x) for x in out]


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_one_row_equals_the_batched_steps_exactly(name):
    div = resolve(name)
    for p, q in _rows():
        for budget in BUDGETS:
            for normalize in (True, False):
                ref = _batched_steps(p, q, budget, div, normalize)
                one = _buckets.solve_one(p, q, budget, div, normalize)
                assert list(one) == ref, (name, p.dtype, budget, normalize, one, ref)
                rows = _buckets.solve_rows(p, q, torch.full((1, 1), budget, dtype=torch.float64), div, False, normalize)
                assert [float(x) for x in rows] == ref


def test_generators_without_a_scalar_twin_take_the_batched_steps():
    p, q = next(_rows())
    assert _router.pick(p, q, 0.05, alpha(0.5).g_float is not None) == _router.BUCKETED_BATCH
    assert _router.pick(p, q, 0.05, resolve("kl").g_float is not None) == _router.BUCKETED_ROW
    fast = _buckets.solve_rows(p, q, torch.full((1, 1), 0.05, dtype=torch.float64), alpha(0.5), False, True)
    assert [float(x) for x in fast] == _batched_steps(p, q, 0.05, alpha(0.5), True)


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
@pytest.mark.parametrize("validate", [True, False])
def test_solve_of_one_row_equals_solve_batch(shape, validate):
    """``solve``'s one-row result tensors (made once) equal those of ``solve_batch`` in shape,
    dtype and value, with ``feasible`` True and no off-support mass."""
    for p, q in _rows():
        p, q = p.reshape(shape + (-1,)), q.reshape(shape + (-1,))
        for budget in (0.0, 0.05, math.inf):
            for name in ("kl", "rkl", "tv"):
                sol = solve(p, q, max_divergence=budget, divergence=name, validate=validate)
                value = check_budget("max_divergence", budget, p.shape[:-1], p.device)
                ref = MDSolution(*_buckets.solve_batch(p, q, value, resolve(name), False, normalize=validate))
                for field in ("a", "b", "acceptance", "achieved_divergence", "sd_acceptance", "feasible",
                              "off_support"):
                    x, y = getattr(sol, field), getattr(ref, field)
                    if field in ("acceptance", "achieved_divergence"):
                        y = y.clamp(0.0, 1.0) if field == "acceptance" else y.clamp(min=0.0)
                    assert x.shape == y.shape == shape and x.dtype == y.dtype, field
                    assert torch.equal(x, y), (field, x, y)


@pytest.mark.parametrize("budget", [-1.0, math.nan])
def test_one_row_budget_errors_are_those_of_a_tensor_budget(budget):
    p, q = next(_rows())
    with pytest.raises(ValueError) as one:
        solve(p[0], q[0], max_divergence=budget)
    with pytest.raises(ValueError) as ref:
        solve(p[0], q[0], max_divergence=torch.tensor(budget))
    assert str(one.value) == str(ref.value)
    bad = p[0].clone()
    bad[3] = -1e-3
    with pytest.raises(ValueError, match="draft_probs contains negative values"):
        solve(bad, q[0], max_divergence=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(20000,), (3, 20000), (2, 3, 20000)])
def test_checked_pair_row_sums_are_those_of_the_rescaling(dtype, shape):
    """The check's float64 row sums equal ``rows_of``'s bit for bit (the rescaling reuses them)."""
    gen = torch.Generator().manual_seed(len(shape))
    p = torch.softmax(torch.randn(shape, generator=gen, dtype=torch.float64) * 3, -1).to(dtype)
    q = torch.softmax(torch.randn(shape, generator=gen, dtype=torch.float64) * 3, -1).to(dtype)
    _, _, sums = checked_pair(p, q)
    ref = rows_of(p.reshape(-1, shape[-1]), q.reshape(-1, shape[-1]), True)
    assert sums[0].shape == shape[:-1] + (1,)
    assert torch.equal(sums[0].reshape(-1, 1), ref.scale_p) and torch.equal(sums[1].reshape(-1, 1), ref.scale_q)


def test_checked_pair_gives_no_sums_for_rows_it_converts_or_does_not_sum_in_torch():
    p, q = _llm_rows(2, 20000, 3, torch.float32)
    assert checked_pair(p.half(), q.half())[2] is None  # half precision: computed in float32
    assert checked_pair(p, q.double())[2] is None  # mixed dtypes: p promoted
    assert checked_pair(p, q, validate=False)[2] is None
    small_p, small_q = _llm_rows(2, 1000, 3, torch.float32)
    assert checked_pair(small_p, small_q)[2] is None  # small rows: numpy's sums (other rounding)
    assert checked_pair(p, q)[2] is not None


@pytest.mark.parametrize("div", [*GENERATORS.values(), alpha(-1.5), alpha(0.3), alpha(1.5), alpha(3.0),
                                 resolve(lambda z: (z - 1.0) ** 4)], ids=lambda d: d.name)
def test_g_numpy_equals_the_generator(div):
    z = np.concatenate([[0.0, 5e-324, 1e-300, 1e-12, 0.5, 1.0, 1 + 1e-15, 2.0, 1e12, 1e300, 1.7e308, math.inf],
                        np.random.default_rng(0).lognormal(0, 4, 500)])
    with np.errstate(all="ignore"):
        got = div.g_numpy(z.copy())
    ref = div.g(torch.from_numpy(z)).numpy()
    assert got.dtype == np.float64
    if div.forms.f_array is None:  # f through torch: the same operations
        np.testing.assert_array_equal(got, ref)
        return
    # the built-in rkl's -log z is numpy's: each log within an ulp of the exact one, so the two differ
    # by at most two ulps of log z, plus the rounding of the sum (docs/theory.md, section 9)
    fin = np.isfinite(ref)
    assert np.array_equal(got[~fin], ref[~fin]) and not np.isnan(got).any()  # the same infinities, signs included
    bound = 2 * np.spacing(np.abs(np.log(z[fin]))) + 2 * np.spacing(np.abs(ref[fin]))
    assert np.all(np.abs(got[fin] - ref[fin]) <= bound)


def test_check_statistics_in_torch_equal_those_in_numpy():
    """Off the CPU the check reads its minima and sum ranges from torch (one read-back): the same
    values, so the same sums, errors and solutions."""
    from mdboost.md._xp import TORCH

    p, q = _llm_rows(2, 20000, 4, torch.float32)
    host = checked_pair(p, q)[2]
    bad = p.clone()
    bad[1, 5] = -1e-4
    with pytest.raises(ValueError) as host_error:
        checked_pair(bad, q)
    dev = checked_pair(p, q, namespace=TORCH)[2]
    assert torch.equal(host[0], dev[0]) and torch.equal(host[1], dev[1])
    with pytest.raises(ValueError) as dev_error:
        checked_pair(bad, q, namespace=TORCH)
    assert str(dev_error.value) == str(host_error.value)


def test_torch_namespace_with_the_check_sums():
    """The accelerators' code path (the torch namespace, forced on CPU) with the check's row sums:
    one row and a batch agree with the numpy namespace and with the sorted breakpoints."""
    from mdboost.md._xp import TORCH
    from mdboost.md.solve import _solve

    p, q = _llm_rows(3, 20000, 9, torch.float32)
    budgets = torch.tensor([1e-4, 0.05, 2.0], dtype=torch.float64)
    ref = [solve(p[i], q[i], max_divergence=float(budgets[i]), divergence="rkl") for i in range(3)]
    batch = solve(p, q, max_divergence=budgets, divergence="rkl")
    for i in range(3):
        one = _solve(p[i], q[i], float(budgets[i]), divergence="rkl", namespace=TORCH)
        torch.testing.assert_close(one.acceptance, ref[i].acceptance, atol=1e-6, rtol=0)
        torch.testing.assert_close(one.achieved_divergence, ref[i].achieved_divergence, atol=1e-7, rtol=1e-5)
    got = _solve(p, q, budgets, divergence="rkl", namespace=TORCH)
    torch.testing.assert_close(got.acceptance, batch.acceptance, atol=1e-6, rtol=0)
    sorted_ref = _buckets.sorted_solve(p, q, budgets.reshape(-1, 1), resolve("rkl"), False, True)
    torch.testing.assert_close(got.acceptance.double(), sorted_ref[2].reshape(-1), atol=1e-6, rtol=0)
