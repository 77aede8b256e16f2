"""The bucket path's bookkeeping (events, bracket, reduction, reduced pair) in both namespaces.

On CPU the per-row bookkeeping runs in numpy; on accelerators (and with autograd) in torch.
Forcing the torch namespace on CPU runs the accelerator code path here: both must agree with
the sorted breakpoints, and with each other to rounding.
"""

from __future__ import annotations

import pytest
import torch

from mdboost.md import _buckets, _xp
from mdboost.md.divergences import resolve
from tests.test_md_buckets import T64, _assert_same, _llm_rows
from tests.test_md_solve import _case


def _rows(kind, n, rows):
    p, q = _case(kind, n, seed=n + 11)
    return torch.from_numpy(p)[None].expand(rows, n), torch.from_numpy(q)[None].expand(rows, n)


@pytest.mark.parametrize("kind,n", [("plain", 5000), ("zeros", 5000), ("peaked", 40), ("equal", 40)])
@pytest.mark.parametrize("name", ["kl", "hellinger", "rkl"])
def test_torch_namespace_matches_the_sorted_path_and_numpy(kind, n, name):
    div = resolve(name)
    budgets = torch.tensor([0.0, 1e-4, 0.02, 0.3, 5.0], **T64).reshape(-1, 1)
    targets = torch.tensor([0.0, 0.3, 0.8, 0.95, 1.0], **T64).reshape(-1, 1)
    p, q = _rows(kind, n, 5)
    for value, dual in ((budgets, False), (targets, True)):
        fast = _buckets.solve_rows(p, q, value, div, dual, False, xp=_xp.TORCH)[:4]
        ref = _buckets.sorted_solve(p, q, value, div, dual, False)[:4]
        _assert_same(fast, ref)
        other = _buckets.solve_rows(p, q, value, div, dual, False)[:4]  # numpy on CPU
        for a, b in zip(fast, other):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_torch_namespace_on_float32_llm_rows():
    p, q = _llm_rows(6, 8192, 5, torch.float32)
    budget = torch.tensor([1e-4, 0.01, 0.05, 0.2, 1.0, 10.0], **T64).reshape(-1, 1)
    fast = _buckets.solve_rows(p, q, budget, resolve("kl"), False, True, xp=_xp.TORCH)[:4]
    ref = _buckets.sorted_solve(p, q, budget, resolve("kl"), False, True)[:4]
    torch.testing.assert_close(fast[2], ref[2], atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_negative_zero_target_entries_are_zeros_in_both_namespaces(dtype):
    """``q = -0.0`` is a zero of the target (``p / q = -inf`` there): both the numpy pass and the
    torch pass bucket it with the ``q = 0`` entries, so the solution equals that of ``q = +0.0``."""
    from mdboost.md.solve import _solve

    p, q = _rows("zeros", 4096, 3)
    p, q = p.to(dtype), q.to(dtype)
    zero = q == 0
    assert bool(zero.any()) and bool((p[zero] > 0).any())
    negative = torch.where(zero, torch.full_like(q, -0.0), q)
    assert bool(torch.signbit(negative[zero]).all())
    for namespace in (_xp.NUMPY, _xp.TORCH):
        ref = _solve(p, q, 0.05, namespace=namespace)
        got = _solve(p, negative, 0.05, namespace=namespace)
        torch.testing.assert_close(got.acceptance, ref.acceptance, rtol=0, atol=0)
        torch.testing.assert_close(got.a, ref.a, rtol=1e-12, atol=0)
