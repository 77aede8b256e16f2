"""Engine tests: exact greedy equality with the target's own ``generate``, the first two tokens'
joint distribution under lossless SD, the MD budget, determinism, KV rollback and the shared-layer
view, the settings' validation, and the drafter interface (schedules, no mutation)."""

import numpy as np
import pytest
import torch
from scipy import stats as sps

from mdboost.engine import (AdaptiveDraftLength, CachedLM, ConfidenceStop, GenerationSettings, ModelDrafter,
                            NgramAdapter, as_drafter, generate)
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
        "other": ModelDrafter(tiny_llama(vocab_size=V, num_layers=1, seed=1)),
        "exit1": ModelDrafter(early_exit(target)),
        "ngram": NgramAdapter(NgramDrafter(2)),
        "shared2": ModelDrafter(early_exit_model(target, 2)),  # modules ARE the target's: drafts on its KV cache
    }


def settings(**kwargs):
    return GenerationSettings(**kwargs)


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
        out = generate(target, ids, settings(gamma=gamma, max_new_tokens=24, temperature=0, eos_token_id=EOS_ID),
                       drafter=drafters[name])
        assert torch.equal(out.sequences, ref)
        assert out.stats.num_accepted_tokens <= out.stats.num_draft_tokens


def test_greedy_ar_equals_target_greedy(target):
    for seed in range(3):
        ids = prompt(seed, 5 + seed)
        out = generate(target, ids, settings(max_new_tokens=20, temperature=0, eos_token_id=EOS_ID))
        assert torch.equal(out.sequences, hf_greedy(target, ids, 20))
        assert out.stats.num_target_calls == out.num_new_tokens.item()


@pytest.mark.parametrize("name", ["other", "shared2"])
def test_outputs_are_ordinary_tensors(target, drafters, name):
    """The loop runs in inference mode; what it returns must still be editable and usable in autograd code."""
    out = generate(target, prompt(1, 5), settings(max_new_tokens=6), drafter=drafters[name],
                   generator=torch.Generator().manual_seed(0))
    assert not out.sequences.is_inference() and not out.num_new_tokens.is_inference()
    out.sequences[0, 0] = 1  # an in-place write on an inference tensor would raise here
    assert out.sequences[0, 0].item() == 1


def test_greedy_ar_takes_argmax_without_the_generator(target):
    """Deterministic decoding never draws: the generator's state is untouched, NaN still raises."""
    ids = prompt(7, 6)
    gen = torch.Generator().manual_seed(5)
    before = gen.get_state()
    out = generate(target, ids, settings(max_new_tokens=12, temperature=0), generator=gen)
    assert torch.equal(gen.get_state(), before)
    assert torch.equal(out.sequences, hf_greedy(target, ids, 12))
    broken = tiny_llama(vocab_size=V, num_layers=1, seed=2)
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        generate(broken, ids, settings(max_new_tokens=2, temperature=0))


@pytest.mark.parametrize("name", ["exit1", "ngram", "shared2"])
def test_greedy_batched_rows_equal_single_rows(target, drafters, name):
    rows = [prompt(10 + i, n)[0].tolist() for i, n in enumerate([3, 6, 5, 4])]
    rows[1] = rows[1] + rows[1][:4]  # repetition for prompt lookup
    ids, mask = left_pad(rows, 0, torch.device("cpu"))
    out = generate(target, ids, settings(gamma=3, max_new_tokens=16, temperature=0, eos_token_id=EOS_ID),
                   attention_mask=mask.long(), drafter=drafters[name])
    for b, row in enumerate(rows):
        ref = hf_greedy(target, torch.tensor([row]), 16)[0, len(row):]
        n = out.num_new_tokens[b].item()
        assert n == ref.numel()
        assert torch.equal(out.sequences[b, ids.shape[1]: ids.shape[1] + n], ref)


def test_drafter_equal_to_target_accepts_everything(target):
    ids = prompt(0, 6).repeat(3, 1)
    for temperature in (0.0, 1.0):
        out = generate(target, ids, settings(gamma=4, max_new_tokens=11, temperature=temperature),
                       drafter=ModelDrafter(target), generator=torch.Generator().manual_seed(0))
        s = out.stats
        assert s.num_accepted_tokens == s.num_draft_tokens > 0
        assert s.mean_accepted_length == 5.0  # 4 drafts + bonus per call (the last call drafts 1)
        assert s.num_target_calls == 3
        assert out.num_new_tokens.tolist() == [11, 11, 11]


def test_shared_kv_drafter_equals_private_cache_drafter(target, drafters):
    rows = [prompt(20 + i, n)[0].tolist() for i, n in enumerate([5, 3, 7])]
    ids, mask = left_pad(rows, 0, torch.device("cpu"))
    model = drafters["shared2"].model
    runs = [
        generate(target, ids, settings(max_divergence=0.1, gamma=3, max_new_tokens=14), attention_mask=mask.long(),
                 drafter=ModelDrafter(model, share_kv=share), generator=torch.Generator().manual_seed(4))
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
    stop = ConfidenceStop(0.3) if case == "model_confidence" else None  # rows stop drafting at will
    drafter = (NgramAdapter(NgramDrafter(1)) if case == "ngram"
               else ModelDrafter(tiny_llama(vocab_size=vocab, num_layers=1, seed=4), confidence_stop=stop))
    ids = torch.tensor([[5, 6, 7, 5, 6]])
    sampling = dict(temperature=0.7, top_k=5) if case == "model_topk" else dict(temperature=1.0)
    out = generate(target, ids.repeat(n, 1), settings(gamma=2, max_new_tokens=2, **sampling), drafter=drafter,
                   generator=torch.Generator().manual_seed(1))
    if stop is not None:
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
    for budget in (0.0, 0.05, 0.5):
        out = generate(target, ids, settings(max_divergence=budget, gamma=3, max_new_tokens=12),
                       drafter=drafters["other"], generator=torch.Generator().manual_seed(2))
        s = out.stats
        assert s.mode == ("md" if budget else "sd")
        assert s.max_divergence <= budget + 1e-5
        assert s.num_budget_accepted <= s.num_accepted_tokens
        if budget:
            assert 0 < s.budget_utilization <= 1 + 1e-5
            assert s.num_budget_accepted > 0
        runs[budget] = s.acceptance_rate
    assert runs[0.0] < runs[0.05] < runs[0.5]


def test_min_acceptance_mode_runs_and_accepts_more(target, drafters):
    ids = prompt(6, 6).repeat(32, 1)
    sd = generate(target, ids, settings(gamma=2, max_new_tokens=8), drafter=drafters["other"],
                  generator=torch.Generator().manual_seed(0))
    md = generate(target, ids, settings(gamma=2, max_new_tokens=8, min_acceptance=0.9), drafter=drafters["other"],
                  generator=torch.Generator().manual_seed(0))
    assert md.stats.acceptance_rate > sd.stats.acceptance_rate
    assert md.stats.acceptance_rate > 0.8


@pytest.mark.parametrize("mode", ["ar", "sd", "md"])
def test_same_seed_same_output(target, drafters, mode):
    ids = prompt(7, 5).repeat(4, 1)
    kw = dict(settings=settings(max_new_tokens=10, max_divergence=0.1 if mode == "md" else 0.0),
              drafter=None if mode == "ar" else drafters["other"])
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
    out = generate(target, ids, settings(max_new_tokens=40, temperature=0, eos_token_id=EOS_ID, pad_token_id=0),
                   drafter=ModelDrafter(target))
    assert torch.equal(out.sequences, ref)
    if EOS_ID in ref[0, 4:].tolist():
        assert out.sequences[0, -1].item() == EOS_ID


def test_adaptive_gamma_keeps_greedy_exact(target, drafters):
    ids = prompt(2, 7)
    drafter = ModelDrafter(drafters["exit1"].model, schedule=AdaptiveDraftLength())
    out = generate(target, ids, settings(gamma=2, max_new_tokens=20, temperature=0, eos_token_id=EOS_ID),
                   drafter=drafter)
    assert torch.equal(out.sequences, hf_greedy(target, ids, 20))
    assert len(out.stats.draft_tokens_per_position) >= 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_new_tokens=0), "max_new_tokens must be a positive integer, got 0"),
        (dict(max_new_tokens=2.5), "max_new_tokens must be a positive integer, got 2.5"),
        (dict(gamma=0), "gamma must be a positive integer, got 0"),
        (dict(gamma=True), "gamma must be a positive integer, got True"),
        (dict(temperature=-1.0), "temperature must be a finite number >= 0, got -1.0"),
        (dict(temperature=float("nan")), "temperature must be a finite number >= 0, got nan"),
        (dict(temperature=float("inf")), "temperature must be a finite number >= 0, got inf"),
        (dict(top_k=0), "top_k must be a positive integer or None, got 0"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\] or None, got 1.5"),
        (dict(max_divergence=-1.0), "max_divergence must be a number >= 0, got -1.0"),
        (dict(max_divergence="0.1"), "max_divergence must be a number >= 0, got '0.1'"),
        (dict(temperature="1"), "temperature must be a finite number >= 0, got '1'"),  # docs/engine.md's example
        (dict(gamma="4"), "gamma must be a positive integer, got '4'"),
        (dict(min_acceptance=1.5), r"min_acceptance must be in \[0, 1\] or None, got 1.5"),
        (dict(max_divergence=0.1, min_acceptance=0.5), "give max_divergence or min_acceptance, not both"),
        (dict(divergence="kullback"), "divergence: divergence must be one of"),
        (dict(md_top_k=-2), "md_top_k must be a positive integer or None, got -2"),
        (dict(md_solve="lazy"), "md_solve must be one of .*, got 'lazy'"),
        (dict(eos_token_id=-1), r"eos_token_id must be a token id \(an integer >= 0\) or None, got -1"),
        (dict(pad_token_id=1.0), r"pad_token_id must be a token id \(an integer >= 0\) or None, got 1.0"),
    ],
)
def test_settings_name_the_bad_field_and_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GenerationSettings(**kwargs)


def test_settings_are_frozen_and_revalidated_on_replace():
    import dataclasses

    s = GenerationSettings(max_divergence=0.1, md_top_k=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.gamma = 8
    with pytest.raises(ValueError, match="gamma"):
        dataclasses.replace(s, gamma=0)
    assert s.lossy and s.verify_args["top_k"] == 4
    lossless = dataclasses.replace(s, max_divergence=0.0)
    assert not lossless.lossy and lossless.verify_args["top_k"] is None  # md_top_k would make SD lossy
    assert GenerationSettings(eos_token_id=7).pad_id == 7 and GenerationSettings(pad_token_id=3).pad_id == 3
    assert GenerationSettings().pad_id == 0


def test_bad_inputs_raise(target):
    with pytest.raises(ValueError, match="input_ids"):
        generate(target, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="vocab_size"):
        generate(target, prompt(0, 3), drafter=ModelDrafter(tiny_llama(vocab_size=V + 1, num_layers=1)))
    with pytest.raises(ValueError, match="attention_mask"):
        generate(target, prompt(0, 3), attention_mask=torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="settings must be a GenerationSettings, got dict"):
        generate(target, prompt(0, 3), dict(max_new_tokens=2))
    with pytest.raises(TypeError, match="drafter must be a Drafter or None .*, got LlamaForCausalLM"):
        generate(target, prompt(0, 3), drafter=target)
    with pytest.raises(TypeError, match=r"^target must be a transformers PreTrainedModel \(a causal LM, e.g. from "
                                        r"mdboost.models.load_model\) or an LMBackend \(e.g. "
                                        r"mdboost.engine.llamacpp.LlamaCppModel\), got str$"):
        generate("tiny", prompt(0, 3))


def test_as_drafter_converts_pool_members_explicitly(target):
    model, ngram = tiny_llama(vocab_size=V, num_layers=1, seed=1), NgramDrafter(2)
    assert isinstance(as_drafter(model), ModelDrafter) and as_drafter(model).model is model
    assert isinstance(as_drafter(ngram), NgramAdapter) and as_drafter(ngram).ngram is ngram
    drafter = ModelDrafter(model)
    assert as_drafter(drafter) is drafter
    from mdboost.models.pool import PoolMember

    as_model = as_drafter(PoolMember("early_exit:1", "early_exit", model, None, None, ""))
    as_ngram = as_drafter(PoolMember("ngram:2", "ngram", None, ngram, None, ""))
    assert isinstance(as_model, ModelDrafter) and as_model.model is model
    assert isinstance(as_ngram, NgramAdapter) and as_ngram.ngram is ngram
    with pytest.raises(TypeError, match="drafter must be a Drafter, a pool member, a transformers PreTrainedModel, an "
                                        r"LMBackend \(llama.cpp\) or an NgramDrafter, got str"):
        as_drafter("early_exit:2")


def test_stats_are_consistent(target, drafters):
    rows = [prompt(30 + i, n)[0].tolist() for i, n in enumerate([4, 6])]
    ids, mask = left_pad(rows, 0, torch.device("cpu"))
    out = generate(target, ids, settings(max_divergence=0.2, gamma=3, max_new_tokens=13), attention_mask=mask.long(),
                   drafter=drafters["other"], generator=torch.Generator().manual_seed(0))
    s = out.stats
    assert s.num_new_tokens == out.num_new_tokens.sum().item() == 26
    assert sum(s.draft_tokens_per_position) == s.num_draft_tokens
    assert sum(s.accepted_tokens_per_position) == s.num_accepted_tokens
    assert s.draft_tokens_per_position == sorted(s.draft_tokens_per_position, reverse=True)
    assert s.num_drafts <= 2 * s.num_target_calls
    assert s.time_total >= s.time_drafter + s.time_target + s.time_verify > 0
    assert s.time_total > s.time_first_step > 0  # the first step feeds the prompts; later steps follow it
    assert 0 <= s.mean_divergence <= s.max_divergence <= 0.2 + 1e-5
    assert s.as_dict()["mean_accepted_length"] == s.mean_accepted_length


def test_md_solve_modes_give_the_same_tokens(target, drafters):
    """md_solve only changes where the clamp is computed, never the output for one seed."""
    ids = prompt(40, 5).repeat(8, 1)
    outs = {}
    for md_solve in ("needed", "reached", "all"):
        outs[md_solve] = generate(target, ids, settings(max_divergence=0.1, gamma=3, max_new_tokens=10, md_solve=md_solve),
                                  drafter=drafters["other"], generator=torch.Generator().manual_seed(4))
    assert torch.equal(outs["needed"].sequences, outs["reached"].sequences)
    assert torch.equal(outs["needed"].sequences, outs["all"].sequences)
    full, fast = outs["reached"].stats, outs["needed"].stats
    assert full.num_solved_positions == full.num_verified_positions == fast.num_verified_positions
    assert 0 < fast.num_solved_positions < fast.num_verified_positions
    counts = full.acceptance_probability_count_per_position
    assert counts[0] == full.num_drafts and counts == sorted(counts, reverse=True)
    assert all(0 <= x <= 1 for x in full.expected_acceptance_per_position)


@pytest.mark.parametrize("name", ["other", "shared2"])
def test_confidence_stop_keeps_greedy_exact_and_drafts_less(target, drafters, name):
    """ConfidenceStop (HF's assistant_confidence_threshold rule): fewer drafts, same greedy output."""
    rows = [prompt(50 + i, n)[0].tolist() for i, n in enumerate([3, 6, 5])]
    ids, mask = left_pad(rows, 0, torch.device("cpu"))
    common = dict(attention_mask=mask.long())
    s = settings(gamma=4, max_new_tokens=14, temperature=0, eos_token_id=EOS_ID)
    full = generate(target, ids, s, drafter=drafters[name], **common)
    stopping = ModelDrafter(drafters[name].model, confidence_stop=ConfidenceStop(0.5))
    stopped = generate(target, ids, s, drafter=stopping, **common)
    assert torch.equal(stopped.sequences, full.sequences)
    assert stopped.stats.num_draft_tokens < full.stats.num_draft_tokens


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


# --------------------------------------------------------------------------- drafter interface


def test_a_drafter_passed_in_is_not_mutated(target, drafters):
    """generate keeps its per-call state in the drafter's session: the drafter's fields stay the
    same objects, and a reused drafter gives what a fresh one gives."""
    import dataclasses

    ids = prompt(60, 6).repeat(3, 1)
    s = settings(gamma=3, max_new_tokens=12, max_divergence=0.1)
    model = drafters["other"].model
    drafter = ModelDrafter(model, schedule=AdaptiveDraftLength(max_length=5), confidence_stop=ConfidenceStop(0.2))
    before = {f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)}
    runs = [generate(target, ids, s, drafter=drafter, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    fresh = generate(target, ids, s, drafter=ModelDrafter(model, schedule=AdaptiveDraftLength(max_length=5),
                                                          confidence_stop=ConfidenceStop(0.2)),
                     generator=torch.Generator().manual_seed(3))
    assert all(getattr(drafter, name) is value for name, value in before.items())
    assert vars(drafter).keys() == before.keys()
    assert torch.equal(runs[0].sequences, runs[1].sequences) and torch.equal(runs[0].sequences, fresh.sequences)
    with pytest.raises(dataclasses.FrozenInstanceError):
        drafter.confidence_stop = None


def test_fixed_and_adaptive_draft_length_rules():
    from mdboost.engine import FixedDraftLength

    assert FixedDraftLength().next_length(7, 4, 7, [0], [0]) == 4
    rule = AdaptiveDraftLength()
    # every active row accepted every draft: +2, capped at 4 * gamma
    assert rule.next_length(4, 4, 4, [4, 4], [4, 4]) == 6
    assert rule.next_length(15, 4, 15, [15], [15]) == 16
    assert rule.next_length(16, 4, 16, [16], [16]) == 16
    # one row short (fewer accepted, or a shorter draft): -1, down to 1
    assert rule.next_length(4, 4, 4, [4, 4], [4, 3]) == 3
    assert rule.next_length(4, 4, 4, [4, 2], [4, 2]) == 3
    assert rule.next_length(1, 4, 1, [1], [0]) == 1
    # near the end fewer tokens were asked: all of them accepted still counts as full
    assert rule.next_length(6, 4, 2, [2], [2]) == 8
    assert AdaptiveDraftLength(max_length=5).next_length(4, 4, 4, [4], [4]) == 5
    with pytest.raises(ValueError, match="max_length must be a positive integer or None, got 0"):
        AdaptiveDraftLength(max_length=0)


def test_adaptive_draft_length_grows_while_everything_is_accepted(target):
    """A drafter equal to the target accepts every draft: lengths 2, 4, 6, 8 (the cap 4 * gamma),
    8, then what is left."""
    s = settings(gamma=2, max_new_tokens=40, temperature=0)
    out = generate(target, prompt(3, 5), s, drafter=ModelDrafter(target, schedule=AdaptiveDraftLength()))
    # emitted per call: 3, 5, 7, 9, 9 (33 tokens), then min(8, 40 - 33 - 1) = 6 drafts + bonus
    assert out.stats.num_target_calls == 6 and out.num_new_tokens.item() == 40
    assert out.stats.draft_tokens_per_position == [6, 6, 5, 5, 4, 4, 2, 2]  # drafts of 2, 4, 6, 8, 8, 6
    fixed = generate(target, prompt(3, 5), s, drafter=ModelDrafter(target))
    assert fixed.stats.num_target_calls == 14 and torch.equal(fixed.sequences, out.sequences)


def test_adaptive_draft_length_never_exceeds_a_max_length_below_gamma(target):
    """max_length=2 with gamma=4: it drafted 4 tokens at the first step (and 3 after a rejection)."""
    rule = AdaptiveDraftLength(max_length=2)
    s = settings(gamma=4, max_new_tokens=20, temperature=0)
    for model in (target, tiny_llama(vocab_size=V, num_layers=1, seed=1)):  # accepts everything / rejects often
        out = generate(target, prompt(3, 5), s, drafter=ModelDrafter(model, schedule=rule))
        assert len(out.stats.draft_tokens_per_position) <= 2
        assert torch.equal(out.sequences, generate(target, prompt(3, 5), s).sequences)
    assert rule.next_length(4, 4, 4, [4], [0]) == 2
    assert rule.first_length(4) == 2 and AdaptiveDraftLength().first_length(4) == 4


@pytest.mark.parametrize("length, error", [(0, ValueError), (2.5, ValueError), (-1, ValueError), (None, TypeError)])
@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_a_user_schedule_length_is_checked(target, length, error, kind):
    """A schedule returning 0 was torch's 'stack expects a non-empty TensorList' (model drafter) or
    no drafting at all (prompt lookup); 2.5, -1 or None a TypeError / IndexError deep in a draft."""

    class Returns:
        def next_length(self, length_, gamma, drafted, lengths, num_accepted):
            return length

    drafter = (ModelDrafter(tiny_llama(vocab_size=V, num_layers=1, seed=1), schedule=Returns()) if kind == "model"
               else NgramAdapter(NgramDrafter(1), schedule=Returns()))
    with pytest.raises(error, match=f"the draft length from Returns.next_length must be a positive integer, "
                                    f"got {length!r}"):
        generate(target, prompt(3, 6), settings(max_new_tokens=10, gamma=3, temperature=0), drafter=drafter)


def test_confidence_stop_rule():
    logits = torch.tensor([[3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, -5.0, -5.0]])
    tokens = torch.tensor([0, 2, 1])
    confidence = torch.softmax(logits, -1)[torch.arange(3), tokens]  # 0.87, 0.25, ~0.5
    for threshold in (0.0, 0.3, 0.6, 1.0):
        assert ConfidenceStop(threshold).stops(logits, tokens).tolist() == (confidence < threshold).tolist()
    with pytest.raises(ValueError, match=r"threshold must be in \[0, 1\], got 1.5"):
        ConfidenceStop(1.5)


def test_update_hook_sees_each_drafted_step_of_the_active_rows(target, drafters):
    """A user-defined Drafter: generate calls propose / commit / update in that order, update
    with the rows still generating, and never on an undrafted last step."""
    from mdboost.engine import Drafter, DraftSession

    class Recording(Drafter):
        def __init__(self, inner):
            self.inner, self.calls = inner, []

        def start(self, prompts, lm, settings):
            inner, calls = self.inner.start(prompts, lm, settings), self.calls

            class Session(DraftSession):
                def propose(self, contexts, max_tokens, generator):
                    calls.append(("propose", max_tokens))
                    return inner.propose(contexts, max_tokens, generator)

                def commit(self, num_accepted, new_tokens):
                    calls.append(("commit", len(num_accepted)))
                    inner.commit(num_accepted, new_tokens)

                def update(self, num_accepted, lengths):
                    calls.append(("update", len(num_accepted)))
                    inner.update(num_accepted, lengths)

            return Session()

    rows = [prompt(70, 4)[0].tolist(), prompt(71, 6)[0].tolist()]
    ids, mask = left_pad(rows, 0, torch.device("cpu"))
    recording = Recording(drafters["exit1"])
    s = settings(gamma=3, max_new_tokens=9, temperature=0)
    out = generate(target, ids, s, attention_mask=mask.long(), drafter=recording)
    plain = generate(target, ids, s, attention_mask=mask.long(), drafter=drafters["exit1"])
    assert torch.equal(out.sequences, plain.sequences)
    kinds = [c[0] for c in recording.calls]
    assert kinds.count("commit") == out.stats.num_target_calls
    drafted = [i for i, k in enumerate(kinds) if k == "propose"]
    assert all(kinds[i + 1: i + 3] == ["commit", "update"] for i in drafted)
    limits = [c[1] for c in recording.calls if c[0] == "propose"]  # tokens the longest row can still use - 1
    assert limits[0] == 8 and limits == sorted(limits, reverse=True) and min(limits) >= 1
    assert all(1 <= c[1] <= 2 for c in recording.calls if c[0] == "update")


@pytest.mark.parametrize("bad, match", [
    ("vocab", r"drafter propose must return probs \[B, w, V\] = \(2, 5, 32\) .*, got \(2, 5, 40\)"),
    ("token", r"drafter propose returned token id 35 outside the target's vocabulary \[0, 32\)"),
    ("lengths", r"drafter propose must return lengths: 2 ints in \[0, 5\], got \[7, 7\]"),
    ("width", r"drafter propose must return tokens \[B=2, w\] with w <= max_tokens=5, got \(2, 8\)"),
])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_user_drafter_proposal_is_checked(target, bad, match, temperature):
    """A DraftSession is user code: a proposal of another vocabulary width was read as is (greedy) or
    named verify's target_probs, an out-of-vocabulary id was an IndexError of the embedding, and
    lengths above the width or more drafts than asked were counted in the stats."""
    from mdboost.engine import Drafter, DraftSession

    class Session(DraftSession):
        def propose(self, contexts, max_tokens, generator):
            w = max_tokens + 3 if bad == "width" else max_tokens
            tokens = torch.full((len(contexts), w), V + 3 if bad == "token" else 5)
            probs = torch.zeros(len(contexts), w, V + 8 if bad == "vocab" else V)
            probs[..., 5] = 1.0
            return tokens, probs, [w + 2 if bad == "lengths" else w] * len(contexts)

        def commit(self, num_accepted, new_tokens):
            pass

        def update(self, num_accepted, lengths):
            pass

    class Bad(Drafter):
        def start(self, prompts, lm, settings):
            return Session()

    with pytest.raises(ValueError, match=match):
        generate(target, prompt(3, 6).repeat(2, 1), settings(max_new_tokens=6, gamma=3, temperature=temperature),
                 drafter=Bad(), generator=torch.Generator().manual_seed(0))


def test_layer_view_continues_the_target_cache(target):
    """The view of the first N layers gives the early-exit drafter's fresh-forward logits over each
    row's own tokens (holes included), and keep([0] * B) hands the target its cache back unchanged."""
    gen = torch.Generator().manual_seed(1)
    cpu = torch.device("cpu")
    drafter = early_exit_model(target, 2)
    lm = CachedLM(target, 3, cpu)
    cached = [[], [], []]
    pending = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]
    for _ in range(3):  # random per-row rollbacks leave holes
        chunk, valid = left_pad(pending, 0, cpu)
        extra = torch.randint(4, V, (3, 3), generator=gen)
        lm.forward(torch.cat([chunk, extra], 1), torch.cat([valid, torch.ones_like(extra, dtype=torch.bool)], 1))
        kept = torch.randint(0, 4, (3,), generator=gen).tolist()
        lm.keep([chunk.shape[1] + k for k in kept])
        for b in range(3):
            cached[b] += pending[b] + extra[b, : kept[b]].tolist()
        pending = [[t] for t in torch.randint(4, V, (3,), generator=gen).tolist()]
    assert lm.holes
    slots, valid_before = lm.cache.get_seq_length(), lm.valid.clone()
    keys_before = lm.cache.layers[0].keys.clone()

    view = lm.layer_view(drafter)
    assert view.cache.layers[0] is lm.cache.layers[0] and len(view.cache.layers) == 2
    chunk, valid = left_pad(pending, 0, cpu)
    logits = view.forward(chunk, valid)
    more = view.forward(torch.tensor([[4], [5], [6]]))
    for b in range(3):
        fresh = drafter(torch.tensor([cached[b] + pending[b] + [4 + b]])).logits[0]
        assert torch.allclose(logits[b, -1], fresh[-2], atol=1e-4)
        assert torch.allclose(more[b, -1], fresh[-1], atol=1e-4)
    view.keep([0, 0, 0])
    assert lm.cache.get_seq_length() == slots and torch.equal(lm.valid, valid_before)
    assert torch.equal(lm.cache.layers[0].keys, keys_before)
    # the target itself continues as if the view had never drafted
    logits = lm.forward(chunk, valid)
    for b in range(3):
        fresh = target(torch.tensor([cached[b] + pending[b]])).logits[0, -1]
        assert torch.allclose(logits[b, -1], fresh, atol=1e-4)
    with pytest.raises(RuntimeError, match="keep"):
        lm.layer_view(drafter)  # columns fed since the last keep
    lm.keep([chunk.shape[1]] * 3)
    with pytest.raises(ValueError, match="decoder layers"):
        lm.layer_view(target)


@pytest.mark.parametrize("batch, settings", [
    (64, GenerationSettings(max_new_tokens=12, gamma=5, eos_token_id=2)),  # EOS inside accepted drafts
    (2, GenerationSettings(max_new_tokens=9, gamma=4, temperature=0.0)),  # a row ahead drafts past its limit
])
def test_stats_count_only_the_drafts_a_row_emits(batch, settings):
    """Accepted drafts that EOS or max_new_tokens discard are not counted: every counted accepted
    token is an emitted one, and a row-step emits its counted accepted drafts plus at most one."""
    target = tiny_llama(vocab_size=8, num_layers=4, hidden_size=32, seed=0)
    drafter = ModelDrafter(early_exit_model(target, 3))  # accepts a lot
    if batch == 2:
        ids = torch.tensor([[0, 0, 1, 5, 6, 7], [1, 4, 6, 5, 7, 3]])
        mask = (torch.arange(6) >= torch.tensor([[2], [0]])).long()
    else:
        ids, mask = torch.tensor([[1, 4, 5]] * batch), None
    row_steps = [0]

    def on_tokens(rows):
        row_steps[0] += sum(1 for r in rows if r)

    out = generate(target, ids, settings, drafter=drafter, attention_mask=mask,
                   generator=torch.Generator().manual_seed(0), on_tokens=on_tokens)
    s, kept = out.stats, int(out.num_new_tokens.sum())
    assert s.num_accepted_tokens <= kept <= s.num_accepted_tokens + row_steps[0]
    assert sum(s.accepted_tokens_per_position) == s.num_accepted_tokens
    assert sum(s.draft_tokens_per_position) == s.num_draft_tokens
    # each counted verified position gave one emitted token; the rest are bonus tokens (one per row-step at most)
    assert s.num_verified_positions <= kept <= s.num_verified_positions + row_steps[0]
    assert sum(s.acceptance_probability_count_per_position) == s.num_verified_positions  # SD: computed everywhere


@pytest.mark.parametrize("make, error, match", [
    (lambda: ModelDrafter(None), TypeError, "model must be a transformers causal LM .*got NoneType"),
    (lambda: ModelDrafter(tiny_llama(vocab_size=8, num_layers=1), schedule=3), TypeError,
     "schedule must be a DraftSchedule .*got 3"),
    (lambda: ModelDrafter(tiny_llama(vocab_size=8, num_layers=1), confidence_stop=0.4), TypeError,
     "confidence_stop must be a ConfidenceStop or None, got 0.4"),
    (lambda: ModelDrafter(tiny_llama(vocab_size=8, num_layers=1), share_kv="no"), TypeError,
     "share_kv must be True or False, got 'no'"),
    (lambda: NgramAdapter(3), TypeError, "ngram must be an NgramDrafter .*got 3"),
    (lambda: NgramAdapter(NgramDrafter(2), schedule=None), TypeError, "schedule must be a DraftSchedule .*got None"),
    (lambda: ConfidenceStop("a"), TypeError, "threshold must be a real number, got 'a'"),
    (lambda: ConfidenceStop(float("nan")), ValueError, r"threshold must be in \[0, 1\], got nan"),
    (lambda: AdaptiveDraftLength(float("inf")), ValueError, "max_length must be a positive integer or None, got inf"),
    (lambda: AdaptiveDraftLength(2.5), ValueError, "max_length must be a positive integer or None, got 2.5"),
    (lambda: NgramDrafter(float("nan")), ValueError, "n must be a positive integer, got nan"),
    (lambda: NgramDrafter(2, max_lookback=float("inf")), ValueError,
     "max_lookback must be a positive integer or None, got inf"),
    (lambda: NgramDrafter(2, max_lookback=1), ValueError, "max_lookback must be an integer >= 2 or None, got 1"),
])
def test_drafter_and_schedule_arguments_are_named_when_built(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_integral_floats_numpy_and_tensor_values_are_accepted_as_before():
    assert AdaptiveDraftLength(4.0).max_length == 4 and AdaptiveDraftLength(np.int64(3)).max_length == 3
    assert ConfidenceStop(torch.tensor(0.5)).threshold == 0.5 and NgramDrafter(torch.tensor(3)).n == 3
    assert ModelDrafter(tiny_llama(vocab_size=8, num_layers=1), share_kv=np.True_).share_kv


@pytest.mark.parametrize("name, processor", [("eos_token_id", None), ("pad_token_id", lambda ids, scores: scores)])
def test_generate_names_a_special_token_outside_the_vocabulary(name, processor):
    """EOS must be a token the target can emit; a pad id only where a logits processor reads the
    pad-filled rows (transformers allows a pad id outside the vocabulary otherwise)."""
    target = tiny_llama(vocab_size=8, num_layers=1, seed=0)
    settings = GenerationSettings(max_new_tokens=2, logits_processor=processor, **{name: 8})
    with pytest.raises(ValueError, match=f"settings.{name}=8 is outside the target's vocabulary"):
        generate(target, torch.tensor([[1, 2]]), settings)


def test_a_pad_id_outside_the_vocabulary_only_fills_finished_rows():
    target = tiny_llama(vocab_size=8, num_layers=1, seed=0)
    out = generate(target, torch.tensor([[1, 2]]), GenerationSettings(max_new_tokens=3, temperature=0.0, pad_token_id=8))
    expected = target.generate(torch.tensor([[1, 2]]), max_new_tokens=3, do_sample=False, pad_token_id=8)
    assert torch.equal(out.sequences, expected)


def test_generate_names_bad_arguments_before_any_work():
    target = tiny_llama(vocab_size=8, num_layers=2, hidden_size=32, seed=0)
    ids = torch.tensor([[1, 4, 5]])
    s = GenerationSettings(max_new_tokens=2)
    for kwargs, error, match in (
        (dict(input_ids=ids.float()), TypeError, "input_ids must hold integer token ids"),
        (dict(input_ids=torch.zeros((0, 3), dtype=torch.long)), ValueError, "at least one row"),
        (dict(input_ids=torch.tensor([[1, 9]])), ValueError, r"token id 9 outside the target's vocabulary \[0, 8\)"),
        (dict(input_ids=torch.tensor([[-1, 2]])), ValueError, "token id -1 outside"),
        (dict(attention_mask=[[1, 1, 1]]), TypeError, "attention_mask must be a tensor"),
        (dict(generator=0), TypeError, "generator must be a torch.Generator"),
        (dict(on_tokens=3), TypeError, "on_tokens must be a callable"),
    ):
        args = dict(input_ids=ids, **{k: v for k, v in kwargs.items() if k != "input_ids"})
        if "input_ids" in kwargs:
            args["input_ids"] = kwargs["input_ids"]
        with pytest.raises(error, match=match):
            generate(target, args.pop("input_ids"), s, **args)
