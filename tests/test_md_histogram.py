"""The histogram pass of the linear-time solve: the log form of ``kl`` and ``rkl``.

For these two generators the pass sums ``w log r`` (``w = p`` or ``q``) and derives each bucket's
``q g(r)`` sum from it (``docs/theory.md``, section 4, step 1). A copy of the same generator that
the pass does not recognise takes the generic route (``g`` per entry): both must give the same
bucket sums, in both namespaces, with zeros of either distribution.
"""

from __future__ import annotations

import math

import pytest
import torch

from mdboost.md import _histogram, _xp
from mdboost.md._histogram import INF, histogram, log_form, rows_of
from mdboost.md.divergences import Divergence, resolve
from tests.test_md_buckets import _llm_rows


def _generic(div: Divergence) -> Divergence:
    """The same generator under another function object: the pass computes ``g`` per entry."""
    return Divergence(div.name, lambda z, f=div.f: f(z), div.fprime_one, div.inf_slope, div.standardize)


def test_log_form_recognises_the_builtin_kl_and_rkl_only():
    assert log_form(resolve("kl")) == (0, 1.0)
    assert log_form(resolve("rkl")) == (1, -1.0)
    for name in ("hellinger", "js", "tv", "alpha:0.5"):
        assert log_form(resolve(name)) is None
    kl = resolve("kl")
    assert log_form(_generic(kl)) is None
    assert log_form(Divergence("kl", kl.f, 2.0, kl.inf_slope)) is None  # another f'(1): another g


def _rows_with_zeros(dtype):
    p, q = _llm_rows(4, 6000, 7, dtype)
    p[0, :30] = 0.0  # p = 0 < q: r = 0 (rkl: g(0) = inf)
    q[1, 30:60] = 0.0  # q = 0 < p: the q = 0 bucket
    p[2, 60:90], q[2, 60:90] = 0.0, 0.0  # neutral
    return p, q


@pytest.mark.parametrize("namespace", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["kl", "rkl"])
@pytest.mark.parametrize("normalize", [False, True])
def test_log_form_sums_equal_the_generic_pass(monkeypatch, namespace, dtype, name, normalize):
    if namespace == "torch":
        monkeypatch.setattr(_histogram, "namespace_for", lambda x: _xp.TORCH)
    p, q = _rows_with_zeros(dtype)
    rows = rows_of(p, q, normalize)
    div = resolve(name)
    got, ref = histogram(rows, div), histogram(rows, _generic(div))
    assert torch.equal(got.index, ref.index)
    torch.testing.assert_close(got.sums[:2], ref.sums[:2], rtol=0, atol=0)  # p and q sums: the same pass
    s, s_ref = got.sums[2, :, :INF], ref.sums[2, :, :INF]
    assert torch.equal(torch.isinf(s), torch.isinf(s_ref))
    if name == "rkl":  # row 0 has p = 0 < q in the lowest bucket: KL(q || pi) is infinite there
        assert math.isinf(float(s[0, 0]))
    finite = torch.isfinite(s_ref)
    # float32 ratios: the log in float32 against g in float64 of the same ratio (section 9)
    tol = 1e-14 if dtype == torch.float64 else 1e-7
    torch.testing.assert_close(s[finite], s_ref[finite], rtol=0, atol=tol)
    assert bool((s[finite] >= 0).all())
