"""The forms of each shipped generator (``mdboost.md.divergences.Forms``) give its values, and the
public view of ``Breakpoints`` (``arrays()``, ``ratios``) matches an independent sort of the pair.

A form is a second spelling of ``f`` or ``g`` chosen for speed (Python floats, one numpy
expression, the closed forms of ``kl`` and ``rkl``): each must equal the torch generator up to the
rounding of its own operations, and apply only where ``f'(1)``, the asymptote and the
standardisation are the shipped generator's (they fix ``g``).
"""

import dataclasses
import pickle

import numpy as np
import pytest
import torch

from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import GENERATORS, Divergence, alpha, from_callable, resolve

EPS = np.finfo(np.float64).eps
Z = np.concatenate([[0.0, 1e-300, 1e-12, 0.5, 1.0 - 1e-9, 1.0, 1.0 + 1e-9, 2.0, 1e12, 1e300],
                    np.random.default_rng(0).lognormal(0, 3, 200)])


def _rounding(z):
    """A bound on the rounding of ``z log z - z + 1`` or ``-log z + z - 1``, either way written (ulps of each term)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.abs(np.where(z > 0, z * np.log(z), 0.0)) + np.abs(np.log(np.where(z > 0, z, 1.0))) + z + 1
    return 8 * EPS * terms


def _agree(got, want):
    """The same infinities; finite values within the rounding of the log forms (:func:`_rounding`)."""
    fin = np.isfinite(want)
    assert np.array_equal(got[~fin], want[~fin])
    assert np.all(np.abs(got[fin] - want[fin]) <= _rounding(Z[fin]) + 4 * EPS * np.abs(want[fin]))


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_each_form_gives_the_generator_s_values(name):
    div = GENERATORS[name]
    forms = div.forms
    ref_f = div(torch.from_numpy(Z)).numpy()
    ref_g = div.g(torch.from_numpy(Z)).numpy()
    assert forms.f_float is not None  # every shipped generator has a float form
    for z, want in zip(Z.tolist(), ref_f.tolist()):
        got = forms.f_float(z)
        # within the rounding of the operations, as the array forms: torch's float64 sqrt is not
        # correctly rounded on every CPU (1 ulp below math.sqrt at z = 0.98672... on an AVX2 EPYC),
        # and (sqrt(z) - 1)^2 near z = 1 turns that ulp into a relative 3e-14
        bound = float(_rounding(np.float64(z))) + 4 * EPS * abs(want)
        assert got == want or abs(got - want) <= bound, (name, z, got, want)
    with np.errstate(all="ignore"):
        if forms.f_array is not None:
            np.testing.assert_allclose(forms.f_array(Z), ref_f, rtol=4 * EPS, atol=0)
        for form in (div.g_array, div.g_numpy):
            _agree(form(Z), ref_g)
        if forms.g_ratio is not None:
            _agree(forms.g_ratio(Z, np), ref_g)
            _agree(forms.g_ratio(torch.from_numpy(Z), torch).numpy(), ref_g)


@pytest.mark.parametrize("name", ["kl", "rkl"])
def test_log_form_is_the_bucket_identity(name):
    """``q g(p / q) = sign (w log(p / q) - p + q)`` with ``w`` = ``p`` or ``q`` (docs/theory.md, section 4)."""
    div = GENERATORS[name]
    w_index, sign = div.forms.log_form
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet([0.5] * 64), rng.dirichlet([0.5] * 64)
    w = (p, q)[w_index]
    ref = q * div.g(torch.from_numpy(p / q)).numpy()
    got = sign * (w * np.log(p / q) - p + q)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-15)


def test_forms_follow_f_and_its_standardisation():
    kl = GENERATORS["kl"]
    same = Divergence("my-kl", kl.f, kl.fprime_one, kl.inf_slope)  # the same g: the same forms
    assert same.forms == kl.forms and same.g_float is kl.g_float
    other = dataclasses.replace(kl, fprime_one=2.0)  # another g: only the forms of f
    assert other.forms.f_float is kl.forms.f_float
    assert other.forms.g_float is other.forms.log_form is other.forms.g_ratio is None
    z = [0.0, 0.3, 1.0, 4.0, 1e8]
    want = other.g(torch.tensor(z, dtype=torch.float64)).tolist()
    assert [other.g_float(x) for x in z] == pytest.approx(want, rel=1e-14, abs=1e-300)
    for div in (alpha(0.5), from_callable(lambda z: (z - 1.0) ** 4)):  # no registered form
        assert div.forms == type(div.forms)() and div.g_float is None


def test_a_generator_pickles_without_its_derived_forms():
    div = dataclasses.replace(GENERATORS["hellinger"], name="hellinger-copy", fprime_one=0.5)
    assert div.g_float is not None and div.g_array is not None  # derived (closures), cached on the instance
    back = pickle.loads(pickle.dumps(div))
    assert back == div and back.g_float(4.0) == div.g_float(4.0)
    assert pickle.loads(pickle.dumps(resolve("kl"))).forms == GENERATORS["kl"].forms


@pytest.mark.parametrize("vocab", [7, 5000])  # the numpy and the torch build
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_breakpoints_arrays_match_an_independent_sort(vocab, dtype):
    rng = np.random.default_rng(vocab)
    p, q = rng.dirichlet([0.3] * vocab, size=3), rng.dirichlet([0.3] * vocab, size=3)
    p[0, 0] = q[1, 1] = 0.0  # r = 0 and r = inf
    p[2, 2] = q[2, 2] = 0.0  # neutral: r = 1
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    pt, qt = torch.from_numpy(p).to(dtype), torch.from_numpy(q).to(dtype)
    bp = Breakpoints.build(pt, qt, normalize=False)
    s = bp.arrays()
    assert bp.backend == ("numpy" if vocab <= 4096 else "torch")
    r = torch.where((pt == 0) & (qt == 0), 1.0, pt / qt).numpy()  # in the input dtype
    order = np.argsort(r, axis=-1, kind="stable")
    r_sorted = np.take_along_axis(r, order, -1)
    assert np.array_equal(bp.ratios.numpy(), r_sorted)
    p, q = pt.double().numpy(), qt.double().numpy()
    p_sorted, q_sorted = np.take_along_axis(p, order, -1), np.take_along_axis(q, order, -1)
    assert np.array_equal(s.q.numpy(), q_sorted)
    np.testing.assert_allclose(s.cq.numpy()[:, 1:], np.cumsum(q_sorted, -1), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(s.cp.numpy()[:, 1:], np.cumsum(p_sorted, -1), rtol=1e-12, atol=1e-15)
    assert np.array_equal(s.n_lt.numpy()[:, 0], (r_sorted < 1).sum(-1))
    assert np.array_equal(s.n_le.numpy()[:, 0], (r_sorted <= 1).sum(-1))
    assert np.array_equal(s.n_fin.numpy()[:, 0], np.isfinite(r_sorted).sum(-1))
    below = r < 1
    np.testing.assert_allclose(s.tv.numpy()[:, 0], np.where(below, q - p, 0.0).sum(-1), rtol=1e-12)  # F(0) = TV
    np.testing.assert_allclose(s.m_end.numpy()[:, 0], np.where(q == 0, p, 0.0).sum(-1), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("div", [*GENERATORS.values(), alpha(-1.5), alpha(0.5)], ids=lambda d: d.name)
def test_every_form_reads_a_negative_zero_as_zero(div):
    """``-0.0`` is the ratio of a zero of ``p`` (docs/theory.md, section 4): each form gives ``g(0)``."""
    want = div.g(torch.tensor([-0.0, 0.0], dtype=torch.float64)).numpy()
    assert want[0] == want[1]
    with np.errstate(all="ignore"):
        for form in (div.g_numpy, div.g_array):
            assert np.array_equal(form(np.array([-0.0, 0.0])), want)
    if div.g_float is not None:
        assert div.g_float(-0.0) == div.g_float(0.0) == want[1]
