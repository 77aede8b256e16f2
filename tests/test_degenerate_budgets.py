"""Degenerate budgets: where an MD budget is at least ``D_f(p || q)`` the mentored distribution is the
drafter's own (``docs/theory.md``, "Degenerate budgets"); the ranking reports the share of such
positions per point (``drafter_share``) and the verdict says when the pick emits the drafter."""

import math

import torch

from mdboost.ranking.acceptance import drafter_shares, md_operating_points
from mdboost.ranking.recommend import recommend
from mdboost.ranking.support import Aligned


def _aligned(n: int = 64, v: int = 12, seed: int = 0) -> Aligned:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(3 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
    # the target: the drafter itself at some positions, a mixture with another law at the others
    other = torch.softmax(3 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
    w = torch.rand(n, 1, generator=g, dtype=torch.float64) * (torch.arange(n)[:, None] % 4 != 0)
    q = (1 - w) * p + w * other
    q[1, 0], q[1, 1:] = 0.0, q[1, 1:] / q[1, 1:].sum()  # a token the target excludes (top-k, top-p)
    return Aligned(p=p, q=q, count=torch.ones(n, v, dtype=torch.float64), log_p=p.log(), log_q=q.log())


def test_drafter_shares_against_the_divergences_written_out():
    aligned = _aligned()
    p, q = aligned.p, aligned.q
    valid = torch.ones(p.shape[0], dtype=torch.bool)
    valid[5] = False
    reference = {"tv": 0.5 * (p - q).abs().sum(-1), "kl": (p * (p / q).log()).sum(-1)}  # sum_i q_i f(p_i / q_i)
    assert reference["tv"][1] < 1 and reference["kl"][1] == math.inf
    reference["tv"][1] = math.inf  # outside q's support p is no feasible mentor, whatever the budget
    budgets = [0.0, 0.05, 0.2, 1.0]
    ops = md_operating_points(aligned, valid, ["tv", "kl"], budgets)
    shares = drafter_shares(valid, ops)
    for op, share in zip(ops, shares):
        d = reference[op.divergence][valid]
        assert share == float((d <= op.max_divergence + 1e-12).double().mean()), (op.divergence, op.max_divergence)
        # where the budget covers D_f(p || q) MD accepts every draft: pi = p
        inside = valid & (reference[op.divergence] <= op.max_divergence)
        assert torch.allclose(op.acceptance[inside], torch.ones(()).double(), atol=1e-9)
        outside = valid & (reference[op.divergence] > op.max_divergence * (1 + 1e-6) + 1e-9)
        assert (op.acceptance[outside] < 1 - 1e-12).all()
    assert shares[budgets.index(1.0)] == 62 / 63  # TV <= 1 always: the drafter everywhere but row 1
    assert 0 < shares[budgets.index(0.0)] < 1  # budget 0: only where q = p
    assert shares == sorted(shares[:4]) + sorted(shares[4:])  # more budget, more such positions
    assert all(math.isnan(s) for s in drafter_shares(torch.zeros_like(valid), ops))


def _row(share, speedup=1.5):
    return {"drafter": "int8", "target": "t", "temperature": 1.0, "divergence": "tv", "max_divergence": 1.0,
            "gamma": 8, "predicted_speedup": speedup, "predicted_speedup_lo": speedup - 0.1,
            "predicted_speedup_hi": speedup + 0.1, "quality_ok": True, "nll_target": 1.0, "nll_mentored": 1.0,
            "drafter_share": share}


def test_the_verdict_says_when_the_pick_emits_the_drafter():
    assert "emits the drafter's own distribution" in recommend([_row(0.97)]).verdict()
    assert "at 97% of positions" in recommend([_row(0.97)]).verdict()
    assert "D_f(p || q)" not in recommend([_row(0.5)]).verdict()
    assert "D_f(p || q)" not in recommend([_row("nan")]).verdict()  # not an MD row (CSV text)
    assert recommend([_row(0.97)]).to_dict()["drafter_share"] == 0.97
