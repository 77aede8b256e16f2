"""The expected linear-time solver (``mdboost.md._buckets``) against the sorted breakpoints.

Both paths solve the same rows; the bucketed one must give the same point (acceptance within
1e-9 in float64, the issue's bar is 1e-6) on the reference cases of ``test_md_solve`` (every
divergence, n from 2 to 5000, zeros, peaked rows, p == q) and on adversarial rows: all ratios
in one bucket (the documented fallback), ties, a huge dynamic range, float32 overflow.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mdboost.md import _buckets, _router
from mdboost.md._checks import is_number
from mdboost.md.divergences import resolve
from mdboost.md.solve import mentored_distribution, solve
from tests.test_md_reference import NAMES, ref_primal
from tests.test_md_solve import CASES, _case

T64 = dict(dtype=torch.float64)
BUDGETS = [0.0, 1e-6, 1e-4, 0.02, 0.3, 5.0, math.inf]


def _both(p, q, value, name, dual=False, normalize=False):
    """``(a, b, acceptance, D_f)`` from both paths, float64 [N, 1] each."""
    div = resolve(name)
    col = value.reshape(-1, 1).to(torch.float64)
    fast = _buckets.solve_rows(p, q, col, div, dual, normalize)[:4]
    ref = _buckets.sorted_solve(p, q, col, div, dual, normalize)[:4]
    return fast, ref


def _assert_same(fast, ref, acc_tol=1e-9, div_tol=1e-9, pair=None):
    """Same acceptance, divergence and ``(a, b)``; with ``pair`` (huge ratios, where ``a`` is
    ill-conditioned in the mass) ``(a, b)`` only through the clamp they give (docs/theory.md, section 9)."""
    a, b, acc, d = fast
    ra, rb, racc, rd = ref
    torch.testing.assert_close(acc, racc, atol=acc_tol, rtol=0)
    finite = torch.isfinite(rd)
    assert torch.equal(finite, torch.isfinite(d))
    torch.testing.assert_close(d[finite], rd[finite], atol=div_tol, rtol=div_tol)
    if pair is not None:
        p, q = pair
        pi = mentored_distribution(p, q, a.reshape(-1), b.reshape(-1))
        torch.testing.assert_close(pi.sum(-1), torch.ones_like(pi[:, 0]), atol=1e-9, rtol=0)
        torch.testing.assert_close(torch.minimum(pi, p).sum(-1), acc.reshape(-1), atol=1e-9, rtol=0)
        return
    torch.testing.assert_close(b, rb, atol=1e-7, rtol=0)
    torch.testing.assert_close(a, ra, atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("kind,n", CASES)
def test_primal_equals_sorted_breakpoints_on_reference_cases(kind, n):
    p, q = _case(kind, n, seed=n + len(kind))
    names = NAMES if n <= 40 else ["kl", "rkl", "hellinger", "tv"]
    budgets = torch.tensor(BUDGETS, **T64)
    rows = len(BUDGETS)
    pt, qt = torch.from_numpy(p)[None].expand(rows, n), torch.from_numpy(q)[None].expand(rows, n)
    for name in names:
        fast, ref = _both(pt, qt, budgets, name)
        _assert_same(fast, ref)
        assert bool((fast[3] <= budgets.reshape(-1, 1) * (1 + 1e-9) + 1e-12).all())


@pytest.mark.parametrize("kind,n", [("plain", 5000), ("zeros", 5000), ("peaked", 5000), ("plain", 40)])
def test_primal_equals_bruteforce_reference(kind, n):
    p, q = _case(kind, n, seed=7 * n + len(kind))
    budgets = [1e-4, 0.05, 0.3]
    pt, qt = torch.from_numpy(p)[None].expand(3, n), torch.from_numpy(q)[None].expand(3, n)
    for name in ["kl", "hellinger"]:
        fast = _buckets.solve_rows(pt, qt, torch.tensor(budgets, **T64).reshape(-1, 1), resolve(name), False, False)
        for i, budget in enumerate(budgets):
            assert float(fast[2][i]) == pytest.approx(ref_primal(p, q, budget, name), abs=1e-7)


@pytest.mark.parametrize("kind,n", CASES)
def test_dual_equals_sorted_breakpoints(kind, n):
    p, q = _case(kind, n, seed=3 * n)
    targets = torch.tensor([0.0, 0.3, 0.6, 0.8, 0.95, 1.0], **T64)
    pt, qt = torch.from_numpy(p)[None].expand(6, n), torch.from_numpy(q)[None].expand(6, n)
    for name in ["kl", "hellinger", "rkl"]:
        fast, ref = _both(pt, qt, targets, name, dual=True)
        _assert_same(fast, ref)


def _llm_rows(rows, vocab, seed, dtype=torch.float64, spread=2.5, noise=0.8):
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * spread
    p = torch.softmax(base + noise * torch.randn(rows, vocab, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(base + noise * torch.randn(rows, vocab, generator=gen, dtype=torch.float64), -1)
    return p.to(dtype), q.to(dtype)


def test_llm_like_rows_reduce_to_few_entries_and_match():
    p, q = _llm_rows(8, 20000, 0)
    budget = torch.tensor([1e-4, 1e-3, 0.01, 0.05, 0.1, 0.5, 2.0, 0.0], **T64).reshape(-1, 1)
    prep, _ = _buckets.prepare_primal(p, q, budget, resolve("kl"), False)
    assert not bool(prep.fallback.any())
    assert prep.bp.vocab < 20000 // 4  # the bracketing buckets hold a fraction of the row
    for name in ["kl", "js", "pearson", "alpha:-1.5", "alpha:1.5"]:
        _assert_same(*_both(p, q, budget, name))


def test_kept_entries_are_those_of_the_bracketing_buckets():
    """The kept positions equal a lookup of every entry's bucket in a table of the kept buckets
    (A: ``C1 + [s_a, t_a)``, B: ``[t_b, s_b)``), for random ranges, empty and inverted ones included."""
    from mdboost.md._bracket import Reduction
    from mdboost.md._histogram import C1, FINITE

    p, q = _llm_rows(6, 8192, 2, torch.float32)
    _, h = _buckets.histogram_of(p, q, resolve("kl"), False)
    index = h.index.numpy()
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(50):
        s_a = rng.integers(0, C1, (6, 1))
        t_a = s_a + rng.integers(-2, 300, (6, 1))
        t_b = rng.integers(0, C1 + 1, (6, 1))
        s_b = t_b + rng.integers(-2, 300, (6, 1))
        buckets = np.arange(FINITE + 1)
        table = ((buckets >= C1 + s_a) & (buckets < C1 + t_a)) | ((buckets >= t_b) & (buckets < s_b))
        kept = _buckets._kept_np(h, Reduction(s_a, t_a, t_b, s_b, None, None, None))
        for i in range(6):
            expected = np.flatnonzero(table[i].take(index[i]))
            np.testing.assert_array_equal(kept[i], expected)
            hits += expected.size
    assert hits > 0


@pytest.mark.parametrize("dtype, normalize", [(torch.float32, False), (torch.float32, True), (torch.float64, True)])
def test_numpy_reduced_pair_equals_the_torch_one(dtype, normalize):
    """The CPU reduced pair (each row's kept entries taken into its own output row) equals the
    torch spelling's (one gather of every kept entry) bit for bit, with rescaled rows, strided
    rows and rows that fall back (too full, or flagged as sorted rows)."""
    from mdboost.md._bracket import Reduction, bracket, events, reduction
    from mdboost.md._histogram import histogram_of
    from mdboost.md._xp import NUMPY, TORCH

    p, q = _llm_rows(9, 8192, 3, dtype)
    gen = torch.Generator().manual_seed(4)  # p within 1e-6 of q: one or two buckets hold every entry (falls back)
    p[4] = q[4] * (1 + 1e-6 * torch.randn(8192, generator=gen, dtype=torch.float64)).to(dtype)
    p[4] /= p[4].sum()
    full_p, full_q = torch.cat([p, p], -1), torch.cat([q, q], -1)
    for rows_p, rows_q in ((p, q), (full_p[:, ::2], full_q[:, ::2])):  # contiguous, then strided rows
        rows, h = histogram_of(rows_p, rows_q, resolve("kl"), normalize)
        ev = events(NUMPY, h, resolve("kl"))
        budget = np.array([[1e-4], [1e-3], [0.01], [0.05], [0.1], [0.5], [2.0], [0.0], [0.05]])
        red = reduction(ev, *bracket(ev, budget), resolve("kl"))
        flagged = torch.zeros(9, dtype=torch.bool)
        flagged[7] = True
        got = _buckets.reduced_pair(NUMPY, rows, h, red, flagged)
        red_t = Reduction(*(None if x is None else torch.from_numpy(np.asarray(x)) for x in red))
        want = _buckets.reduced_pair(TORCH, rows, h, red_t, flagged)
        assert bool(got[2][4]) and bool(got[2][7]) and not bool(got[2][0])
        for x, y in zip(got, want):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


def test_float32_rows_match_the_sorted_path():
    p, q = _llm_rows(6, 8192, 1, torch.float32)
    budget = torch.tensor([1e-4, 0.01, 0.05, 0.2, 1.0, 10.0], **T64)
    for name in ["kl", "hellinger"]:
        fast, ref = _both(p, q, budget, name)
        torch.testing.assert_close(fast[2], ref[2], atol=1e-6, rtol=0)


def test_all_ratios_in_one_bucket_fall_back_to_the_sorted_path():
    """Worst case: every ratio within 1e-6 of 1 (one or two buckets): the rows are solved sorted."""
    gen = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(4, 6000, generator=gen, **T64), -1)
    p = q * (1 + 1e-6 * torch.randn(4, 6000, generator=gen, **T64))
    p = p / p.sum(-1, keepdim=True)
    budget = torch.tensor([1e-14, 1e-13, 1e-12, 1.0], **T64).reshape(-1, 1)
    prep, _ = _buckets.prepare_primal(p, q, budget, resolve("kl"), False)
    assert bool(prep.fallback.all())
    _assert_same(*_both(p, q, budget, "kl"), acc_tol=1e-12, div_tol=1e-12)


def test_ties_and_two_valued_ratios():
    """Many equal ratios (blocks of identical entries): ties inside and at bucket edges."""
    n = 6000
    q = torch.full((n,), 1.0 / n, **T64)
    p = torch.where(torch.arange(n) % 3 == 0, 2.0, 0.5).to(torch.float64)
    p = p / p.sum()
    edge = torch.where(torch.arange(n) % 2 == 0, 1.0625, 0.9375).to(torch.float64)  # ratios on bucket edges
    p2 = q * edge
    p2 = p2 / p2.sum()
    pt, qt = torch.stack([p, p2, p, p2]), torch.stack([q, q, q, q])
    for name in ["kl", "tv", "hellinger"]:
        budget = torch.tensor([1e-3, 1e-3, 0.1, 0.1], **T64)
        _assert_same(*_both(pt, qt, budget, name))
        _assert_same(*_both(pt, qt, torch.tensor([0.3, 0.5, 0.7, 0.99], **T64), name, dual=True))


def test_huge_dynamic_range_and_zeros():
    """Ratios from 1e-300 to 1e300 (beyond the regular buckets), zeros in p and q."""
    rng = np.random.default_rng(5)
    n = 5000
    logs = rng.uniform(-690, 0, size=(3, n))
    p = np.exp(logs + rng.normal(0, 5, size=(3, n)))
    q = np.exp(logs)
    p[0, :100] = 0.0
    q[1, :50] = 0.0
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    pt, qt = torch.from_numpy(p), torch.from_numpy(q)
    for name in ["kl", "rkl", "pearson", "neyman"]:
        for budget in [1e-3, 0.3, 30.0]:
            _assert_same(*_both(pt, qt, torch.full((3,), budget, **T64), name), pair=(pt, qt))


def test_float32_overflowing_ratio_counts_as_zero_target():
    p, q = _llm_rows(2, 5000, 2, torch.float32)
    q[:, 7] = 1e-45  # subnormal: p / q overflows float32
    q = q / q.sum(-1, keepdim=True)
    budget = torch.tensor([0.05, math.inf], **T64)
    fast, ref = _both(p, q, budget, "kl")
    torch.testing.assert_close(fast[2], ref[2], atol=1e-7, rtol=0)


def test_normalized_rows_match():
    p, q = _llm_rows(3, 5000, 4)
    p, q = p * (1 + 1e-7), q * (1 - 1e-7)  # within the sum tolerance
    budget = torch.tensor([1e-3, 0.05, 1.0], **T64)
    _assert_same(*_both(p, q, budget, "kl", normalize=True))


def test_solve_and_verify_take_the_bucketed_path():
    p, q = _llm_rows(2, _router.MIN_VOCAB, 6)
    assert _router.pick(p, q, None, True) == _router.BUCKETED_BATCH
    assert _router.pick_rows(p.reshape(1, 2, -1)) == _router.BUCKETED_BATCH  # verify's per-position solves
    assert _router.pick(p[:, :-1], q[:, :-1], None, True) == _router.SORTED
    assert _router.pick_rows(p[:, :-1]) == _router.SORTED
    sol = solve(p, q, max_divergence=0.05)
    ref = _buckets.sorted_solve(p, q, torch.full((2, 1), 0.05, **T64), resolve("kl"), False, True)
    torch.testing.assert_close(sol.acceptance, ref[2].reshape(-1), atol=1e-12, rtol=0)
    torch.testing.assert_close(sol.sd_acceptance, (1 - ref[4]).reshape(-1), atol=1e-12, rtol=0)


def _bucketed_route(p, q, value, dual, div):
    """The bucketed route of an exact solve of any vocabulary: ``bucketed-row`` for one CPU row with
    a Python-number budget and a generator with a Python-float form, ``bucketed-batch`` otherwise
    (the router's pick for an empty batch)."""
    if not p.numel():
        return {}
    row = (not dual and is_number(value) and p.numel() == p.shape[-1] and p.device.type == "cpu"
           and resolve(div).g_float is not None)
    return dict(route=_router.BUCKETED_ROW if row else _router.BUCKETED_BATCH)


def test_fuzzed_inputs_keep_the_contract_on_the_bucketed_path():
    """The core's fuzz harness (subnormals, near-overflow ratios, zeros, one-hot rows, half
    precision, ...) with every vocabulary's exact solves on the bucketed routes."""
    from tests import _fuzz_core

    report = _fuzz_core.run(20260101, 250, (torch.float64, torch.float32), time_budget=15.0,
                            routing=_bucketed_route)
    assert report.total >= 150
    for kind in _fuzz_core.KINDS:
        assert report.count(kind) == 0, (kind, report.failures[kind][:5])
