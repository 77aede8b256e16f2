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
from mdboost.md._histogram import INF, histogram, rows_of
from mdboost.md.divergences import Divergence, resolve
from tests.test_md_buckets import _llm_rows


def _generic(div: Divergence) -> Divergence:
    """The same generator under another function object: the pass computes ``g`` per entry."""
    return Divergence(div.name, lambda z, f=div.f: f(z), div.fprime_one, div.inf_slope, div.standardize)


def test_log_form_recognises_the_builtin_kl_and_rkl_only():
    assert resolve("kl").forms.log_form == (0, 1.0)
    assert resolve("rkl").forms.log_form == (1, -1.0)
    for name in ("hellinger", "js", "tv", "alpha:0.5"):
        assert resolve(name).forms.log_form is None
    kl = resolve("kl")
    assert _generic(kl).forms.log_form is None
    assert Divergence("kl", kl.f, 2.0, kl.inf_slope).forms.log_form is None  # another f'(1): another g


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
def test_log_form_sums_equal_the_generic_pass(namespace, dtype, name, normalize):
    xp = _xp.TORCH if namespace == "torch" else None  # None: the rule (numpy on CPU)
    p, q = _rows_with_zeros(dtype)
    rows = rows_of(p, q, normalize)
    div = resolve(name)
    got, ref = histogram(rows, div, xp), histogram(rows, _generic(div), xp)
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


def _bad_inputs(dtype):
    """(p, q, which argument is bad) on the bucketed path, one defect each."""
    p, q = _llm_rows(3, 4096, 11, dtype)
    cases = []
    for name, idx, value in (("draft_probs", (1, 7), math.nan), ("target_probs", (2, 9), -1e-3),
                             ("draft_probs", (0, 3), math.inf)):
        pp, qq = p.clone(), q.clone()
        (pp if name == "draft_probs" else qq)[idx] = value
        cases.append((pp, qq, name))
    qq = q.clone()
    qq[1] *= 1.01  # a row summing to 1.01, beyond both dtypes' tolerance
    cases.append((p, qq, "target_probs"))
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_checks_in_the_pass_raise_the_input_checks_errors(dtype):
    """Rows on the linear-time path are checked in the histogram's pass: a bad entry raises the
    same ValueError (naming the argument) as the check made before it, for one row and batches."""
    from mdboost.md._checks import check_pair
    from mdboost.md.solve import solve

    for p, q, name in _bad_inputs(dtype):
        assert _histogram.takes_numpy_pass(p, q)
        with pytest.raises(ValueError) as expected:
            check_pair(p, q)
        assert name in str(expected.value)
        for pp, qq in ((p, q), (p[1], q[1]) if name == "target_probs" else (p[0], q[0])):
            if pp is not p:  # the one-row call holds the defect only if that row has it
                try:
                    check_pair(pp, qq)
                    continue
                except ValueError as err:
                    message = str(err)
            else:
                message = str(expected.value)
            for dual in (False, True):
                kwargs = dict(min_acceptance=0.9) if dual else dict(max_divergence=0.05)
                with pytest.raises(ValueError) as got:
                    solve(pp, qq, **kwargs)
                assert str(got.value) == message


def test_half_precision_rows_keep_their_own_tolerance():
    """Half-precision rows are checked before their conversion (the float16 tolerance), not in the pass."""
    from mdboost.md.solve import solve

    p, q = _llm_rows(2, 4096, 12, torch.float64)
    p16, q16 = p.to(torch.float16), (q * 1.004).to(torch.float16)  # sums ~1.004: within float16's 1e-2
    ref = solve(p16.float() / p16.float().sum(-1, keepdim=True), q16.float() / q16.float().sum(-1, keepdim=True),
                max_divergence=0.05)
    got = solve(p16, q16, max_divergence=0.05)
    torch.testing.assert_close(got.acceptance.float(), ref.acceptance, atol=1e-6, rtol=0)
