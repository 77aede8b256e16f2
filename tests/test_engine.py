"""Engine tests: exact greedy equality with the target's own ``generate``, the first two tokens'
joint distribution under lossless SD, the MD budget, determinism, and KV rollback."""

import numpy as np
import pytest
import torch
from scipy import stats as sps

from mdboost.engine import CachedLM, generate
from mdboost.engine.kv import left_pad
from mdboost.md.probs import logits_to_probs
from mdboost.models.drafters import early_exit_model
from mdboost.models.ngram import NgramDrafter
from mdboost.models.tiny import EOS_ID, tiny_llama

V = 32


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=V, num_layers=3, seed=0)


def early_exit(target, layers=1, vocab=V):
    """A drafter made of the target's first ``layers`` layers, embeddings, norm and head."""
    drafter = tiny_llama(vocab_size=vocab, num_layers=layers, seed=99)
    drafter.load_state_dict(target.state_dict(), strict=False)
    return drafter.eval()


@pytest.fixture(scope="module")
def drafters(target):
    return {
        "other": tiny_llama(vocab_size=V, num_layers=1, seed=1),
        "exit1": early_exit(target),
        "ngram": NgramDrafter(2),
        "shared2": early_exit_model(target, 2),  # modules ARE the target's: drafts on its KV cache
    }


def prompt(seed, length, vocab=V):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (1, length), generator=g)


def hf_greedy(model, ids, n):
    return model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=EOS_ID, pad_token_id=0)


@pytest.mark.parametrize("name", ["other", "exit1", "ngram", "shared2"])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_sd_equals_target_greedy(target, drafters, name, gamma):
    for seed in range(3):
        ids = prompt(seed, 4 + 3 * seed)
        if name == "ngram":  # a repetitive prompt so that prompt lookup proposes something
            ids = torch.cat([ids, ids, ids[:, :2]], dim=1)
        ref = hf_greedy(target, ids, 24)
        out = generate(target, ids, drafter=drafters[name], mode="sd", gamma=gamma,
                       max_new_tokens=24, temperature=0, eos_token_id=EOS_ID)
        assert torch.equal(out.sequences, ref)
        assert out.stats.num_accepted_tokens <= out.stats.num_draft_tokens


def test_greedy_ar_equals_target_greedy(target):
    for seed in range(3):
        ids = prompt(seed, 5 + seed)
        out = generate(target, ids, mode="ar", max_new_tokens=20, temperature=0, eos_token_id=EOS_ID)
        assert torch.equal(out.sequences, hf_greedy(target, ids, 20))
        assert out.stats.num_target_calls == out.num_new_tokens.item()


@pytest.mark.parametrize("name", ["other", "shared2"])
def test_outputs_are_ordinary_tensors(target, drafters, name):
    """The loop runs in inference mode; what it returns must still be editable and usable in autograd code."""
    out = generate(target, prompt(1, 5), drafter=drafters[name], mode="sd", max_new_tokens=6, temperature=1.0,
                   generator=torch.Generator().manual_seed(0))
    assert not out.sequences.is_inference() and not out.num_new_tokens.is_inference()
    out.sequences[0, 0] = 1  # an in-place write on an inference tensor would raise here
    assert out.sequences[0, 0].item() == 1


def test_greedy_ar_takes_argmax_without_the_generator(target):
    """Deterministic decoding never draws: the generator's state is untouched, NaN still raises."""
    ids = prompt(7, 6)
    gen = torch.Generator().manual_seed(5)
    before = gen.get_state()
    out = generate(target, ids, mode="ar", max_new_tokens=12, temperature=0, generator=gen)
    assert torch.equal(gen.get_state(), before)
    assert torch.equal(out.sequences, hf_greedy(target, ids, 12))
    broken = tiny_llama(vocab_size=V, num_layers=1, seed=2)
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        generate(broken, ids, mode="ar", max_new_tokens=2, temperature=0)


@pytest.mark.parametrize("name", ["exit1", "ngram", "shared2"])
def test_greedy_batched_rows_equal_single_rows(target, drafters, name):
    rows = [prompt(10 + i, n)[0].tolist() for i, n in enumerate([3, 6, 5, 4])]
    rows[1] = rows[1] + rows[1][:4]  # repetition for prompt lookup
    ids, mask = left_pad(rows, 0, torch.device("cpu"))
    out = generate(target, ids, attention_mask=mask.long(), drafter=drafters[name], mode="sd", gamma=3,
                   max_new_tokens=16, temperature=0, eos_token_id=EOS_ID)
    for b, row in enumerate(rows):
        ref = hf_greedy(target, torch.tensor([row]), 16)[0, len(row):]
        n = out.num_new_tokens[b].item()
        assert n == ref.numel()
        assert torch.equal(out.sequences[b, ids.shape[1]: ids.shape[1] + n], ref)


def test_drafter_equal_to_target_accepts_everything(target):
    ids = prompt(0, 6).repeat(3, 1)
    for temperature in (0.0, 1.0):
        out = generate(target, ids, drafter=target, mode="sd", gamma=4, max_new_tokens=11,
                       temperature=temperature, generator=torch.Generator().manual_seed(0))
        s = out.stats
        assert s.num_accepted_tokens == s.num_draft_tokens > 0
        assert s.mean_accepted_length == 5.0  # 4 drafts + bonus per call (the last call drafts 1)
        assert s.num_target_calls == 3
        assert out.num_new_tokens.tolist() == [11, 11, 11]


def test_shared_kv_drafter_equals_private_cache_drafter(target, drafters):
    rows = [prompt(20 + i, n)[0].tolist() for i, n in enumerate([5, 3, 7])]
    ids, mask = left_pad(rows, 0, torch.device("cpu"))
    runs = [
        generate(target, ids, attention_mask=mask.long(), drafter=drafters["shared2"], mode="md", max_divergence=0.1,
                 gamma=3, max_new_tokens=14, generator=torch.Generator().manual_seed(4), share_kv=share)
        for share in (True, False)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.num_accepted_tokens == runs[1].stats.num_accepted_tokens > 0


def exact_joint(model, ids, **sampling):
    """q(x1) q(x2 | x1) over the vocabulary, by brute force (no cache)."""
    with torch.no_grad():
        q1 = logits_to_probs(model(ids).logits[0, -1].double(), **sampling)
        vocab = q1.numel()
        seqs = torch.cat([ids.repeat(vocab, 1), torch.arange(vocab)[:, None]], dim=1)
        q2 = logits_to_probs(model(seqs).logits[:, -1].double(), **sampling)
    return (q1[:, None] * q2).numpy()


@pytest.mark.parametrize("case", ["model", "ngram", "model_topk", "model_confidence"])
def test_sampled_sd_first_two_tokens_follow_target_joint(case):
    vocab, n = 8, 6000
    target = tiny_llama(vocab_size=vocab, num_layers=2, seed=3)
    drafter = NgramDrafter(1) if case == "ngram" else tiny_llama(vocab_size=vocab, num_layers=1, seed=4)
    ids = torch.tensor([[5, 6, 7, 5, 6]])
    sampling = dict(temperature=0.7, top_k=5) if case == "model_topk" else dict(temperature=1.0)
    extra = dict(draft_confidence=0.3) if case == "model_confidence" else {}  # rows stop drafting at will
    out = generate(target, ids.repeat(n, 1), drafter=drafter, mode="sd", gamma=2, max_new_tokens=2,
                   generator=torch.Generator().manual_seed(1), **sampling, **extra)
    if extra:
        assert 0 < out.stats.num_draft_tokens < 2 * out.stats.num_drafts  # some rows stopped at one draft
    pairs = out.sequences[:, -2:].numpy()
    counts = np.zeros((vocab, vocab))
    np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    expected = exact_joint(target, ids, **sampling) * n
    assert counts[expected == 0].sum() == 0
    keep = expected > 0
    chi2 = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    assert sps.chi2.sf(chi2, keep.sum() - 1) > 1e-3
    assert out.stats.num_draft_tokens > 0


def test_md_respects_budget_and_accepts_more(target, drafters):
    ids = prompt(5, 6).repeat(64, 1)
    runs = {}
    for mode, budget in (("sd", 0.0), ("md", 0.05), ("md", 0.5)):
        out = generate(target, ids, drafter=drafters["other"], mode=mode, max_divergence=budget, gamma=3,
                       max_new_tokens=12, generator=torch.Generator().manual_seed(2))
        s = out.stats
        assert s.max_divergence <= budget + 1e-5
        assert s.num_budget_accepted <= s.num_accepted_tokens
        if budget:
            assert 0 < s.budget_utilization <= 1 + 1e-5
            assert s.num_budget_accepted > 0
        runs[budget] = s.acceptance_rate
    assert runs[0.0] < runs[0.05] < runs[0.5]


def test_min_acceptance_mode_runs_and_accepts_more(target, drafters):
    ids = prompt(6, 6).repeat(32, 1)
    common = dict(drafter=drafters["other"], gamma=2, max_new_tokens=8)
    sd = generate(target, ids, mode="sd", generator=torch.Generator().manual_seed(0), **common)
    md = generate(target, ids, mode="md", min_acceptance=0.9, generator=torch.Generator().manual_seed(0), **common)
    assert md.stats.acceptance_rate > sd.stats.acceptance_rate
    assert md.stats.acceptance_rate > 0.8


@pytest.mark.parametrize("mode", ["ar", "sd", "md"])
def test_same_seed_same_output(target, drafters, mode):
    ids = prompt(7, 5).repeat(4, 1)
    kw = dict(mode=mode, drafter=None if mode == "ar" else drafters["other"], max_new_tokens=10,
              max_divergence=0.1 if mode == "md" else 0.0)
    a = generate(target, ids, generator=torch.Generator().manual_seed(0), **kw)
    b = generate(target, ids, generator=torch.Generator().manual_seed(0), **kw)
    c = generate(target, ids, generator=torch.Generator().manual_seed(1), **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert not torch.equal(a.sequences, c.sequences)


def test_cache_rollback_matches_fresh_forward(target):
    """Random per-row rollbacks, then every new logit equals a fresh no-cache forward."""
    gen = torch.Generator().manual_seed(0)
    cpu = torch.device("cpu")
    cached = [[], [], []]  # tokens each row keeps in the cache
    pending = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]
    lm = CachedLM(target, 3, cpu)
    for _ in range(6):
        chunk, valid = left_pad(pending, 0, cpu)
        extra = torch.randint(4, V, (3, 4), generator=gen)
        logits = lm.forward(torch.cat([chunk, extra], 1), torch.cat([valid, torch.ones_like(extra, dtype=torch.bool)], 1))
        for b in range(3):
            fresh = target(torch.tensor([cached[b] + pending[b] + extra[b].tolist()])).logits[0, -4:]
            assert torch.allclose(logits[b, -4:], fresh, atol=1e-4)
        kept = torch.randint(0, 5, (3,), generator=gen).tolist()
        lm.keep([chunk.shape[1] + k for k in kept])
        for b in range(3):
            cached[b] += pending[b] + extra[b, : kept[b]].tolist()
        pending = [[t] for t in torch.randint(4, V, (3,), generator=gen).tolist()]
        assert lm.valid.sum(1).tolist() == [len(c) for c in cached]
    assert lm.holes and lm.cache.get_seq_length() == lm.num_slots


def test_eos_stops_rows_and_pads(target):
    ids = prompt(1, 4)
    ref = hf_greedy(target, ids, 40)
    out = generate(target, ids, drafter=target, mode="sd", max_new_tokens=40, temperature=0,
                   eos_token_id=EOS_ID, pad_token_id=0)
    assert torch.equal(out.sequences, ref)
    if EOS_ID in ref[0, 4:].tolist():
        assert out.sequences[0, -1].item() == EOS_ID


def test_adaptive_gamma_keeps_greedy_exact(target, drafters):
    ids = prompt(2, 7)
    out = generate(target, ids, drafter=drafters["exit1"], mode="sd", gamma=2, adaptive_gamma=True,
                   max_new_tokens=20, temperature=0, eos_token_id=EOS_ID)
    assert torch.equal(out.sequences, hf_greedy(target, ids, 20))
    assert len(out.stats.draft_tokens_per_position) >= 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mode="beam"), "mode"),
        (dict(mode="sd"), "drafter"),
        (dict(mode="sd", drafter="d", max_divergence=0.1), "lossless"),
        (dict(mode="md", drafter="d"), "max_divergence"),
        (dict(mode="ar", gamma=0), "gamma"),
        (dict(mode="ar", max_new_tokens=0), "max_new_tokens"),
        (dict(mode="md", drafter="d", max_divergence=-1.0), "max_divergence"),
        (dict(mode="md", drafter="d", min_acceptance=1.5), "min_acceptance"),
    ],
)
def test_bad_arguments_raise(target, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(target, prompt(0, 3), **kwargs)


def test_bad_inputs_raise(target):
    with pytest.raises(ValueError, match="input_ids"):
        generate(target, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="vocab_size"):
        generate(target, prompt(0, 3), drafter=tiny_llama(vocab_size=V + 1, num_layers=1), mode="sd")
    with pytest.raises(ValueError, match="attention_mask"):
        generate(target, prompt(0, 3), attention_mask=torch.ones(1, 4, dtype=torch.long))


def test_stats_are_consistent(target, drafters):
    rows = [prompt(30 + i, n)[0].tolist() for i, n in enumerate([4, 6])]
    ids, mask = left_pad(rows, 0, torch.device("cpu"))
    out = generate(target, ids, attention_mask=mask.long(), drafter=drafters["other"], mode="md", max_divergence=0.2,
                   gamma=3, max_new_tokens=13, generator=torch.Generator().manual_seed(0))
    s = out.stats
    assert s.num_new_tokens == out.num_new_tokens.sum().item() == 26
    assert sum(s.draft_tokens_per_position) == s.num_draft_tokens
    assert sum(s.accepted_tokens_per_position) == s.num_accepted_tokens
    assert s.draft_tokens_per_position == sorted(s.draft_tokens_per_position, reverse=True)
    assert s.num_drafts <= 2 * s.num_target_calls
    assert s.time_total >= s.time_drafter + s.time_target + s.time_verify > 0
    assert 0 <= s.mean_divergence <= s.max_divergence <= 0.2 + 1e-5
    assert s.as_dict()["mean_accepted_length"] == s.mean_accepted_length


def test_md_solve_modes_give_the_same_tokens(target, drafters):
    """md_solve only changes where the clamp is computed, never the output for one seed."""
    ids = prompt(40, 5).repeat(8, 1)
    outs = {}
    for md_solve in ("needed", "reached", "all"):
        outs[md_solve] = generate(target, ids, drafter=drafters["other"], mode="md", max_divergence=0.1, gamma=3,
                                  max_new_tokens=10, md_solve=md_solve, generator=torch.Generator().manual_seed(4))
    assert torch.equal(outs["needed"].sequences, outs["reached"].sequences)
    assert torch.equal(outs["needed"].sequences, outs["all"].sequences)
    full, fast = outs["reached"].stats, outs["needed"].stats
    assert full.num_solved_positions == full.num_verified_positions == fast.num_verified_positions
    assert 0 < fast.num_solved_positions < fast.num_verified_positions
    counts = full.acceptance_probability_count_per_position
    assert counts[0] == full.num_drafts and counts == sorted(counts, reverse=True)
    assert all(0 <= x <= 1 for x in full.expected_acceptance_per_position)
    with pytest.raises(ValueError, match="md_solve"):
        generate(target, ids, drafter=drafters["other"], mode="md", max_divergence=0.1, md_solve="lazy")


@pytest.mark.parametrize("name", ["other", "shared2"])
def test_confidence_stop_keeps_greedy_exact_and_drafts_less(target, drafters, name):
    """draft_confidence (HF's assistant_confidence_threshold rule): fewer drafts, same greedy output."""
    rows = [prompt(50 + i, n)[0].tolist() for i, n in enumerate([3, 6, 5])]
    ids, mask = left_pad(rows, 0, torch.device("cpu"))
    common = dict(attention_mask=mask.long(), drafter=drafters[name], mode="sd", gamma=4, max_new_tokens=14,
                  temperature=0, eos_token_id=EOS_ID)
    full = generate(target, ids, **common)
    stopped = generate(target, ids, draft_confidence=0.5, **common)
    assert torch.equal(stopped.sequences, full.sequences)
    assert stopped.stats.num_draft_tokens < full.stats.num_draft_tokens
    with pytest.raises(ValueError, match="draft_confidence"):
        generate(target, ids, draft_confidence=1.5, **common)


def test_stats_add_verified_counts_solved_positions_only():
    from mdboost.engine.stats import GenerationStats

    stats = GenerationStats(mode="md", budget=0.2)
    stats.add_verified([0.1, float("nan")], [0.5, 0.7], budget_accepted=1)
    stats.add_verified([0.3], [0.3])
    stats.add_verified([float("nan")], [float("nan")])  # verified, neither solved nor computed
    assert (stats.num_verified_positions, stats.num_solved_positions, stats.num_budget_accepted) == (4, 2, 1)
    assert stats.divergence_sum == pytest.approx(0.4) and stats.max_divergence == pytest.approx(0.3)
    assert stats.mean_divergence == pytest.approx(0.2) and stats.budget_utilization == pytest.approx(1.0)
    assert stats.acceptance_probability_count_per_position == [2, 1]
    assert stats.expected_acceptance_per_position == pytest.approx([0.4, 0.7])
    with pytest.raises(ValueError, match="divergences and acceptance_probs"):
        stats.add_verified([0.1], [0.5, 0.5])
