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


def _alone(**fields) -> dict:
    row = {"drafter": "early_exit:2", "target": "tiny", "temperature": 1.0, "divergence": "tv", "max_divergence": 0.4,
           "gamma": 0, "predicted_speedup": 1.9, "predicted_speedup_lo": 1.7, "predicted_speedup_hi": 2.1,
           "quality_ok": True, "nll_target": 2.0, "nll_mentored": 2.03, "rule": "alone", "drafting": "none",
           "drafter_share": 1.0}
    return {**row, **fields}


def test_the_drafter_alone_is_recommended_and_exported_as_a_call_that_runs():
    from mdboost.export import mdboost_snippet

    rec = recommend([_row(0.97), _alone()])
    assert (rec.rule, rec.gamma, rec.beats_plain_decoding) == ("alone", 0, True)
    assert rec.verdict() == ("recommended: early_exit:2 alone (instead of tiny), T=1: predicted speedup 1.90x "
                             "[1.70, 2.10] over plain decoding")
    snippet = mdboost_snippet(rec.to_dict(), {"top_k": None, "top_p": None}, "cpu")
    assert "generate(model, input_ids, settings)" in snippet and "drafter=" not in snippet
    namespace = {}
    exec(compile(snippet.replace("print(", "str("), "<snippet>", "exec"), namespace)  # builds tiny offline and decodes
    model, out = namespace["model"], namespace["out"]
    assert model is not None and out.stats.num_draft_tokens == 0 and int(out.num_new_tokens[0]) > 0
    # outside the quality tolerance it is no candidate
    assert recommend([_row(0.97), _alone(quality_ok=False)]).rule != "alone"


def test_a_summary_gamma_of_zero_belongs_to_the_drafter_alone():
    import pytest

    from mdboost.ranking.summary_check import check_recommendation

    rec = {k: v for k, v in _alone().items() if k not in ("quality_ok",)} | {"beats_plain_decoding": True}
    assert check_recommendation(rec, "here")["gamma"] == 0
    with pytest.raises(ValueError, match=r"here: summary.json's recommendation.gamma must be 0 exactly for the rule "
                                         r"'alone' \(got rule 'mentored'\), got 0"):
        check_recommendation(rec | {"rule": "mentored"}, "here")
    with pytest.raises(ValueError, match=r"recommendation.gamma must be 0 exactly for the rule 'alone'"):
        check_recommendation(rec | {"gamma": 3}, "here")


def test_a_mode_decoding_alone_is_plain_decoding_and_takes_no_drafter():
    import pytest

    from mdboost.models import tiny_llama
    from mdboost.validation.runs import run_modes

    target, drafter = tiny_llama(seed=0), tiny_llama(seed=1)
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]
    runs = run_modes(target, prompts, {"ar": dict(mode="ar"), "alone": dict(mode="ar", model=drafter),
                                       "self": dict(mode="ar", model=target)}, max_new_tokens=6, temperature=1.0)
    assert runs["self"].outputs == runs["ar"].outputs  # the same model and seeds: the same tokens
    assert runs["alone"].outputs != runs["ar"].outputs  # another model's own tokens
    with pytest.raises(ValueError, match=r"modes\['x'\]: model decodes alone, in mode 'ar' only, got mode 'sd'"):
        run_modes(target, prompts, {"x": dict(mode="sd", drafter=drafter, model=drafter)}, max_new_tokens=2)
