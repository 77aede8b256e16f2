"""The notebook port of ``bench/_notebook.py``: what it samples, and its off-by-one in ``beta``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from _notebook import emitted_distribution, mentored_sampling, notebook_solve  # noqa: E402

from mdboost.md.divergences import f_divergence  # noqa: E402


def _pair(vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(vocab, generator=gen) * 2
    p = torch.softmax(base + torch.randn(vocab, generator=gen), -1)
    q = torch.softmax(base + torch.randn(vocab, generator=gen), -1)
    return p, q


def test_emitted_distribution_is_what_the_sampler_draws():
    """Frequencies of ``mentored_sampling`` (draft x ~ p) against :func:`emitted_distribution`."""
    p, q = _pair(6, seed=1)
    point = notebook_solve(p, q, 0.05)
    assert point.alpha is not None and point.alpha < 1  # the solve runs (no early exit)
    want = emitted_distribution(p, q, point)
    gen = torch.Generator().manual_seed(0)
    draws = 20000
    drafts = torch.multinomial(p, draws, replacement=True, generator=gen)
    counts = torch.zeros(6, dtype=torch.float64)
    for x in drafts.tolist():
        counts[int(mentored_sampling(x, p, q, 0.05, generator=gen))] += 1
    chi2 = float(((counts - draws * want) ** 2 / (draws * want)).sum())
    assert chi2 < 25.0  # 5 degrees of freedom: p-value ~1e-4
    assert abs(float(want.sum()) - 1) < 1e-12


def test_the_beta_off_by_one_makes_dkl_underestimate():
    """With ``beta`` read at ``n2`` the notebook's own ``dkl`` is the realized ``KL(q || pi)``;
    read at ``n2 - 1`` (the notebook) it is below it."""
    under = 0
    for seed in range(20):
        p, q = _pair(200, seed)
        q64 = q.double()
        for fixed in (True, False):
            point = notebook_solve(p, q, 0.05, fix_beta_index=fixed)
            if point.alpha is None or point.alpha == 1:
                continue
            realized = float(f_divergence(emitted_distribution(p, q, point), q64 / q64.sum(), "rkl",
                                          validate=False))
            if fixed:
                assert abs(float(point.dkl) - realized) <= 1e-4 * realized + 1e-6, seed
            else:
                under += float(point.dkl) < realized - 1e-6
    assert under >= 15
