"""``Threshold`` and ``Match`` against SGLang's own kernel, token for token.

The oracle is the torch port of SGLang 0.5.23's ``TreeSpeculativeSamplingTargetOnly``
(``tests/engines/sglang_tree.py``, tested against SGLang's kernel tests in
``tests/test_engine_sglang_port.py``), run on a chain, the tree of ``--speculative-eagle-topk 1``.
Both sides get the same uniforms: mdboost's ``K + 1`` per row (``mdboost/md/sampling.py``) are
SGLang's coins of nodes ``0..K-1`` (the acceptance tests) and its final-sampling coin
(``verify_chain`` documents the mapping). Greedy drafts (the argmax of ``p``), as SGLang's
EAGLE/STANDALONE drafters produce at topk 1 (``fast_topk``, ``srt/utils/common.py`` line 3941).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mdboost.md.rules import Match, Threshold
from mdboost.md.sampling import draw_uniforms
from tests.engines.sglang_tree import verify_chain


def _case(seed: int):
    """Random (B, K, V), float32 ``p`` and a target with zeros (as after top-k / top-p), greedy
    drafts, some drafts on a zero of the target."""
    rng = np.random.default_rng(seed)
    batch, k, v = int(rng.integers(1, 9)), int(rng.integers(1, 6)), int(rng.integers(2, 40))
    p = rng.dirichlet(np.full(v, 0.3), size=(batch, k))
    q = rng.dirichlet(np.full(v, 0.3), size=(batch, k + 1)) * (rng.random((batch, k + 1, v)) < 0.7)
    q[..., 0] += 1e-3  # every row keeps some mass
    q /= q.sum(-1, keepdims=True)
    p, q = torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32)
    # half the positions draft the argmax of a p aligned with q (high acceptance), half an independent p
    aligned = torch.tensor(rng.random((batch, k, 1)) < 0.5)
    p = torch.where(aligned, 0.5 * p + 0.5 * q[:, :k], p)
    return p, q, p.argmax(-1)


def _thresholds(seed: int):  # -> (c, s): SGLang's threshold_acc and threshold_single
    rng = np.random.default_rng(1000 + seed)
    return tuple(float(x) for x in rng.choice([1.0, *rng.uniform(0.05, 1.0, 3)], size=2))


def _both(rule, p, q, tokens, seed, *, threshold_single, threshold_acc):
    result = rule.verify(tokens, p, q, generator=torch.Generator().manual_seed(seed))
    u = draw_uniforms(*tokens.shape, dtype=torch.float32, device=p.device,
                      generator=torch.Generator().manual_seed(seed))
    port_tokens, port_accepted = verify_chain(tokens, q, u, threshold_single=threshold_single,
                                              threshold_acc=threshold_acc)
    return result, port_tokens, port_accepted


@pytest.mark.parametrize("seed", range(12))
def test_threshold_emits_the_tokens_of_sglang(seed):
    p, q, tokens = _case(seed)
    c, s = _thresholds(seed)
    result, port_tokens, port_accepted = _both(Threshold(accept=c, single=s, drafting="greedy"), p, q, tokens, seed,
                                               threshold_single=s, threshold_acc=c)
    assert result.tokens.tolist() == port_tokens.tolist()
    assert result.num_accepted.tolist() == port_accepted.tolist()


@pytest.mark.parametrize("seed", range(6))
def test_match_is_sglang_at_thresholds_one(seed):
    p, q, tokens = _case(100 + seed)
    result, port_tokens, port_accepted = _both(Match(drafting="greedy"), p, q, tokens, seed,
                                               threshold_single=1.0, threshold_acc=1.0)
    assert result.tokens.tolist() == port_tokens.tolist()
    assert result.num_accepted.tolist() == port_accepted.tolist()


def test_the_cases_exercise_every_branch():
    """The cases of ``test_threshold_emits_the_tokens_of_sglang`` reject and accept, reach the
    bonus, draft zeros of the target, and accept by ``single`` where ``min(1, q_x / c)`` alone
    would not; ``c = 1`` and ``c < 1`` both occur."""
    seen = dict(rejected=0, all_accepted=0, zero_target_draft=0, single_decides=0, lossless=0, lossy=0)
    for seed in range(12):
        p, q, tokens = _case(seed)
        c, s = _thresholds(seed)
        q_x = torch.gather(q[:, :-1], -1, tokens.unsqueeze(-1)).squeeze(-1)
        u = draw_uniforms(*tokens.shape, dtype=torch.float32, device=p.device,
                          generator=torch.Generator().manual_seed(seed))
        _, accepted = verify_chain(tokens, q, u, threshold_single=s, threshold_acc=c)
        reached = torch.arange(tokens.shape[1]) <= accepted.unsqueeze(-1)  # [B, K] positions tested
        seen["rejected"] += int((accepted < tokens.shape[1]).sum())
        seen["all_accepted"] += int((accepted == tokens.shape[1]).sum())
        seen["zero_target_draft"] += int(((q_x == 0) & reached).sum())
        seen["single_decides"] += int(((q_x >= s) & (u[:, :-1] >= q_x / c) & reached).sum())
        seen["lossless" if c == 1 else "lossy"] += 1
    assert all(n > 0 for n in seen.values()), seen
