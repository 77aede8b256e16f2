"""The CPU fast path of Breakpoints.build (packed-key numpy sort) against torch.sort."""

import math

import pytest
import torch

from mdboost.md import _sums
from mdboost.md._xp import TORCH
from mdboost.md.breakpoints import Breakpoints


def _rows(dtype, vocab=300, rows=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = torch.rand(rows, vocab, generator=gen, dtype=torch.float64)
    q = torch.rand(rows, vocab, generator=gen, dtype=torch.float64)
    p[:, :5] = 0.0  # r = 0
    q[:, 5:10] = 0.0  # r = inf
    p[:, 10:15] = q[:, 10:15] = 0.0  # 0/0 -> r = 1
    q[:, 15:40] = p[:, 15:40] * (1 + 1e-14)  # near-ties just below r = 1
    return (p / p.sum(-1, keepdim=True)).to(dtype), (q / q.sum(-1, keepdim=True)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sort_rows_is_a_sorting_permutation(dtype):
    p, q = _rows(dtype)
    r = torch.nan_to_num(p / q, nan=1.0, posinf=math.inf)
    r_s, p_s, q_s = _sums._sort_rows(r, p, q)
    ref = torch.sort(r, dim=-1).values
    if dtype == torch.float32:
        assert torch.equal(r_s, ref)
    else:  # near-ties (relative < 2^-43 for V = 300) may be swapped, nothing else
        assert torch.equal(torch.isinf(r_s), torch.isinf(ref))
        fin = torch.isfinite(ref)
        assert torch.allclose(r_s[fin], ref[fin], rtol=2.0**-40, atol=0)
        assert torch.equal((r_s < 1).sum(-1), (ref < 1).sum(-1))
    # the permutation carries (p, q) pairs along: multisets of pairs are unchanged
    for i in range(p.shape[0]):
        before = sorted(zip(p[i].tolist(), q[i].tolist()))
        assert before == sorted(zip(p_s[i].tolist(), q_s[i].tolist()))
    # exactly the sorted order of r (ties aside, within float64's packed-key resolution)
    r_of_pairs = torch.nan_to_num(p_s / q_s, nan=1.0, posinf=math.inf)
    assert torch.all(r_of_pairs[:, 1:] >= r_of_pairs[:, :-1] * (1 - 1e-9))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numpy_and_torch_paths_agree(dtype):
    p, q = _rows(dtype, seed=1)
    fast = Breakpoints.build(p, q).for_divergence(0.05, "kl")
    slow = Breakpoints.build(p, q, namespace=TORCH).for_divergence(0.05, "kl")  # torch.sort, torch sums
    tol = 1e-10 if dtype == torch.float64 else 1e-6
    for x, y in zip(fast, slow):
        assert torch.allclose(x, y, atol=tol, rtol=0)
