"""``mdboost.hf.mentored_generate`` as a transformers ``custom_generate``: greedy equality with
transformers' plain and assisted generation, the first two tokens' joint distribution (chi-square,
engine sampling and processor hooks), the MD budget, stopping, streaming, the engine's own output,
drafter specs, bad input, and the calling convention transformers uses."""

import inspect

import numpy as np
import pytest
import torch
from scipy import stats as sps
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    SequenceBiasLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper)
from transformers.generation.stopping_criteria import MaxLengthCriteria
from transformers.generation.utils import GenerationMixin

import mdboost.hf
from mdboost.engine import GenerationSettings, ModelDrafter, generate
from mdboost.hf import MentoredGenerateOutput, drafter_for, mentored_generate
from mdboost.md.rules import Threshold
from mdboost.models.tiny import EOS_ID, PAD_ID, tiny_llama

V = 32


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=V, num_layers=3, seed=0)


@pytest.fixture(scope="module")
def other(target):
    return tiny_llama(vocab_size=V, num_layers=1, seed=1)


def prompt(seed, length, batch=1, vocab=V):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (batch, length), generator=g)


def md(model, ids, **kwargs):
    return model.generate(ids, custom_generate=mentored_generate, **kwargs)


# --- the calling convention -------------------------------------------------------------------

def test_transformers_calling_convention_is_the_one_we_rely_on():
    """Fails loudly when transformers changes how it calls a callable ``custom_generate``."""
    assert "custom_generate" in inspect.signature(GenerationMixin.generate).parameters
    sample = list(inspect.signature(GenerationMixin._sample).parameters)
    ours = inspect.signature(mentored_generate).parameters
    # positional head: (model, input_ids), then the three keywords transformers always passes
    assert sample[:5] == ["self", "input_ids", "logits_processor", "stopping_criteria", "generation_config"]
    assert list(ours)[:5] == ["model", "input_ids", "logits_processor", "stopping_criteria", "generation_config"]
    # only names absent from _sample's signature are forwarded: every MD argument must be one
    md_names = {n for n, p in ours.items() if p.kind is inspect.Parameter.KEYWORD_ONLY} - {"streamer"}
    assert md_names and not md_names & set(sample)
    # streamer IS in _sample's signature, so transformers 5.x does not forward it (documented)
    assert "streamer" in sample
    source = inspect.getsource(GenerationMixin._extract_generation_mode_kwargs)
    assert "inspect.signature(GenerationMixin._sample)" in source and "inspect.signature(custom_generate)" in source
    # ... so mentored_generate reads it from generate's own frame, which calls the custom_generate
    assert "result = decoding_method(" in inspect.getsource(GenerationMixin.generate)


def test_generate_forwards_our_keywords(target, other):
    seen = {}

    def spy(model, input_ids, logits_processor=None, stopping_criteria=None, generation_config=None, *,
            drafter=None, max_divergence=0.0, num_draft_tokens=4, **model_kwargs):
        seen.update(drafter=drafter, max_divergence=max_divergence, num_draft_tokens=num_draft_tokens,
                    model_kwargs=set(model_kwargs), max_length=generation_config.max_length)
        return input_ids

    ids = prompt(0, 5)
    target.generate(ids, custom_generate=spy, drafter=other, max_divergence=0.25, num_draft_tokens=3, max_new_tokens=7)
    assert seen["drafter"] is other and seen["max_divergence"] == 0.25 and seen["num_draft_tokens"] == 3
    assert seen["max_length"] == 5 + 7
    assert seen["model_kwargs"] <= set(mdboost.hf._IGNORED_MODEL_KWARGS)


# --- greedy: exact equality ----------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["other", "early_exit:2", "ngram:2"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_budget0_equals_plain_and_assisted(target, other, spec, gamma):
    drafter = other if spec == "other" else spec
    for seed in range(3):
        ids = prompt(seed, 4 + 3 * seed)
        plain = target.generate(ids, do_sample=False, max_new_tokens=24)
        assisted = target.generate(ids, assistant_model=other, do_sample=False, max_new_tokens=24)
        ours = md(target, ids, drafter=drafter, num_draft_tokens=gamma, do_sample=False, max_new_tokens=24)
        assert torch.equal(ours, plain) and torch.equal(ours, assisted)


def test_greedy_batch_equals_plain_batch(target, other):
    ids = prompt(3, 6, batch=4)
    plain = target.generate(ids, do_sample=False, max_new_tokens=20)  # finished rows padded with pad
    ours = md(target, ids, drafter=other, do_sample=False, max_new_tokens=20)
    assert torch.equal(ours, plain)


def test_greedy_processors_reach_both_models(target, other):
    """repetition_penalty / no_repeat_ngram_size run as hooks on drafter and target logits alike."""
    kwargs = dict(do_sample=False, max_new_tokens=24, repetition_penalty=1.8, no_repeat_ngram_size=2)
    for seed in range(3):
        ids = prompt(seed, 6)
        plain = target.generate(ids, **kwargs)
        assert not torch.equal(plain, target.generate(ids, do_sample=False, max_new_tokens=24))
        for drafter in (other, "early_exit:2", "ngram:2"):
            assert torch.equal(md(target, ids, drafter=drafter, **kwargs), plain)


class StopAfter(StoppingCriteria):
    """Stops a row once ``token`` was generated (after the prompt)."""

    def __init__(self, token, prompt_length):
        self.token, self.prompt_length = token, prompt_length

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids[:, self.prompt_length:] == self.token).any(dim=1)


def test_stopping_criteria_and_several_eos_ids(target, other):
    ids = prompt(1, 6)
    free = target.generate(ids, do_sample=False, max_new_tokens=30)[0, 6:].tolist()
    token = free[len(free) // 2]  # a token the greedy continuation emits mid-way
    stop = StoppingCriteriaList([StopAfter(token, 6)])
    plain = target.generate(ids, do_sample=False, max_new_tokens=30, stopping_criteria=stop)
    assert plain.shape[1] < 6 + 30
    ours = md(target, ids, drafter=other, do_sample=False, max_new_tokens=30, stopping_criteria=stop)
    assert torch.equal(ours, plain)
    eos = [EOS_ID, free[3]]
    plain = target.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=eos)
    assert plain.shape[1] <= 6 + 4
    assert torch.equal(md(target, ids, drafter=other, do_sample=False, max_new_tokens=30, eos_token_id=eos), plain)


# --- sampling: distribution and budget ------------------------------------------------------------

def _joint_reference(model, ids, processors):  # [1, T] -> {(t1, t2): probability}
    """Brute force: q(t1) q(t2 | t1) from full forwards, ``processors`` applied as transformers does."""
    with torch.no_grad():
        first = torch.softmax(processors(ids, model(ids).logits[:, -1].float()), -1)[0]
        table = {}
        for t1 in range(V):
            if first[t1] == 0:
                continue
            if t1 == EOS_ID:  # the row stops; transformers pads the second column
                table[(t1, PAD_ID)] = float(first[t1])
                continue
            ctx = torch.cat([ids, torch.tensor([[t1]])], 1)
            second = torch.softmax(processors(ctx, model(ctx).logits[:, -1].float()), -1)[0]
            for t2 in range(V):
                if second[t2] > 0:
                    table[(t1, t2)] = float(first[t1] * second[t2])
    return table


def _chi_square_p(sequences, table):
    pairs = [tuple(r) for r in sequences[:, -2:].tolist()]
    cells = sorted(table, key=table.get, reverse=True)
    n = len(pairs)
    assert all(p in table for p in pairs), "a pair outside the target's support"
    big = [c for c in cells if table[c] * n >= 5]
    counts = np.array([sum(p == c for p in pairs) for c in big] + [sum(p not in big for p in pairs)], float)
    expected = np.array([table[c] * n for c in big] + [n * (1 - sum(table[c] for c in big))])
    keep = expected > 0
    return sps.chisquare(counts[keep], expected[keep] * counts[keep].sum() / expected[keep].sum()).pvalue


@pytest.mark.parametrize("case", ["engine sampling", "processor hooks"])
def test_sampled_budget0_first_two_tokens_follow_the_target(target, other, case):
    """Lossless SD through generate: the joint law of the first two tokens is the target's
    (with the same processors), for native temperature / top-k and for processors run as hooks."""
    n, ids = 3000, prompt(5, 5)
    if case == "engine sampling":
        kwargs = dict(temperature=0.8, top_k=12)
        processors = LogitsProcessorList([TemperatureLogitsWarper(0.8), TopKLogitsWarper(12)])
    else:
        # a context-dependent processor that reads the last token only (whole-row ones are refused for B > 1)
        bias = {(t, t): -1.5 for t in range(V)}  # repeating the previous token costs 1.5 nats
        kwargs = dict(temperature=0.8, sequence_bias=bias, min_p=0.02)
        processors = LogitsProcessorList([SequenceBiasLogitsProcessor(bias), TemperatureLogitsWarper(0.8),
                                          MinPLogitsWarper(0.02)])
    out = md(target, ids.repeat(n, 1), drafter=other, num_draft_tokens=2, do_sample=True, max_new_tokens=2,
             generator=torch.Generator().manual_seed(0), return_dict_in_generate=True, **kwargs)
    assert out.stats.num_draft_tokens == n  # every row drafted (one draft: two tokens left)
    assert _chi_square_p(out.sequences, _joint_reference(target, ids, processors)) > 1e-3


@pytest.mark.parametrize("divergence", ["kl", "tv"])
def test_every_realized_divergence_within_budget(target, other, divergence):
    budget = 0.05
    out = md(target, prompt(2, 6, batch=3), drafter=other, max_divergence=budget, divergence=divergence,
             md_solve="reached", do_sample=True, temperature=0.7, max_new_tokens=40,
             generator=torch.Generator().manual_seed(1), return_dict_in_generate=True)
    stats = out.stats
    assert isinstance(out, MentoredGenerateOutput) and stats.mode == "md" and stats.budget == budget
    assert stats.num_solved_positions == stats.num_verified_positions > 0  # "reached": every position solved
    assert stats.mean_divergence > 0 and stats.num_budget_accepted > 0  # the budget was used
    assert stats.max_divergence <= budget * (1 + 1e-5)


def test_same_tokens_as_the_engine(target, other):
    """generate(custom_generate=...) is the engine's call: same seed, same tokens and stats."""
    ids = prompt(4, 7, batch=2)
    out = md(target, ids, drafter=other, max_divergence=0.1, num_draft_tokens=3, do_sample=True, temperature=0.7,
             top_p=0.9, max_new_tokens=30, generator=torch.Generator().manual_seed(3), return_dict_in_generate=True)
    settings = GenerationSettings(max_new_tokens=30, gamma=3, temperature=0.7, top_p=0.9, max_divergence=0.1,
                                  eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    ref = generate(target, ids, settings, drafter=ModelDrafter(other), generator=torch.Generator().manual_seed(3))
    assert torch.equal(out.sequences, ref.sequences) and torch.equal(out.num_new_tokens, ref.num_new_tokens)
    assert out.stats.num_accepted_tokens == ref.stats.num_accepted_tokens


def test_direct_call_reads_max_new_tokens_as_generate_does(target, other):
    """Called directly (no generate to turn max_new_tokens into max_length first), a config's
    max_new_tokens still sets the length, and wins over its max_length as in transformers."""
    ids = prompt(8, 6, batch=2)
    ref = md(target, ids, drafter=other, num_draft_tokens=2, do_sample=False, max_new_tokens=5)
    for config in (GenerationConfig(do_sample=False, max_new_tokens=5, eos_token_id=EOS_ID, pad_token_id=PAD_ID),
                   GenerationConfig(do_sample=False, max_new_tokens=5, max_length=40, eos_token_id=EOS_ID,
                                    pad_token_id=PAD_ID)):
        out = mentored_generate(target, ids, LogitsProcessorList(), StoppingCriteriaList(), config, drafter=other,
                                num_draft_tokens=2)
        assert torch.equal(out, ref) and out.shape[1] <= 6 + 5


# --- streamer, drafters, bad input ------------------------------------------------------------

class Recorder:
    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value)

    def end(self):
        self.ended += 1


def test_streamer_receives_the_new_tokens(target, other):
    ids = prompt(6, 5)
    config = GenerationConfig(do_sample=False, max_length=5 + 16, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    streamer = Recorder()
    out = mentored_generate(target, ids, LogitsProcessorList(), StoppingCriteriaList([MaxLengthCriteria(5 + 16)]),
                            config, drafter=other, streamer=streamer)
    assert streamer.ended == 1 and all(p.shape[0] == 1 for p in streamer.puts)
    assert torch.cat([p[0] for p in streamer.puts]).tolist() == out[0, 5:].tolist()


def consume(streamer, call):
    """Run ``call`` in a thread while reading ``streamer`` here, as a TextIteratorStreamer's user does;
    the streamer's own timeout turns a consumer that would wait forever into ``queue.Empty``."""
    import threading

    box = {}

    def work():
        try:
            box["out"] = call()
        except Exception as err:  # noqa: BLE001 -- handed to the test below
            box["err"] = err

    thread = threading.Thread(target=work)
    thread.start()
    text = "".join(streamer)
    thread.join(timeout=30)
    return text, box


@pytest.mark.parametrize("skip_prompt", [True, False])
def test_a_text_iterator_streamer_given_to_generate_streams_and_ends(target, other, skip_prompt):
    """transformers 5.x puts the prompt into generate's streamer but never forwards it to a callable
    custom_generate: the consumer got the prompt and then waited forever for end(). The streamer is
    read from generate's call: the consumer gets the new tokens and stops."""
    from transformers import TextIteratorStreamer

    from mdboost.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer(V)
    streamer = TextIteratorStreamer(tok, skip_prompt=skip_prompt, timeout=20)
    ids = prompt(6, 5)
    text, box = consume(streamer, lambda: md(target, ids, drafter=other, do_sample=False, max_new_tokens=12,
                                             streamer=streamer))
    assert "err" not in box
    out = box["out"]
    new = tok.decode(out[0, 5:])
    assert text == (new if skip_prompt else tok.decode(ids[0]) + new)
    assert torch.equal(out, md(target, ids, drafter=other, do_sample=False, max_new_tokens=12))


def test_a_streamer_ends_when_the_call_fails(target):
    """generate has put the prompt before mentored_generate checks its arguments: a refused call
    ends the streamer too, so its consumer stops instead of waiting."""
    from transformers import TextIteratorStreamer

    from mdboost.models.tiny import tiny_tokenizer

    streamer = TextIteratorStreamer(tiny_tokenizer(V), timeout=20)
    text, box = consume(streamer, lambda: md(target, prompt(6, 5), do_sample=False, max_new_tokens=4,
                                             streamer=streamer))
    assert isinstance(box["err"], ValueError) and "drafter is required" in str(box["err"])


def test_only_generate_s_own_frame_hands_over_its_streamer():
    """A direct call (any caller but GenerationMixin.generate) has no streamer but its own argument."""
    import sys

    streamer = Recorder()  # noqa: F841 -- a local named like generate's, in a frame that is not generate's
    assert mdboost.hf.streamer_given_to_generate(sys._getframe(0)) is None
    assert mdboost.hf.streamer_given_to_generate(None) is None


def test_drafter_specs_are_built_from_the_target_once(target):
    for spec in ("ngram:3", "early_exit:1", "tuned:2", "int8"):
        drafter = drafter_for(target, spec)
        assert drafter_for(target, spec) is drafter
        ids = prompt(7, 6)
        out = md(target, ids, drafter=spec, do_sample=False, max_new_tokens=12)
        assert torch.equal(out, target.generate(ids, do_sample=False, max_new_tokens=12))


@pytest.mark.parametrize("kwargs, message", [
    (dict(drafter=None), "drafter is required"),
    (dict(drafter="early_exit:99"), "drafter 'early_exit:99'"),
    (dict(drafter="/nonexistent-mdboost-drafter"), "model '/nonexistent-mdboost-drafter': no such model folder"),
    (dict(drafter="ngram:2", num_draft_tokens=0), "num_draft_tokens must be a positive integer, got 0"),
    (dict(drafter="ngram:2", max_divergence=-1.0), "max_divergence must be a number >= 0, got -1.0"),
    (dict(drafter="ngram:2", return_dict_in_generate=True, output_scores=True), "output_scores=True"),
    (dict(drafter="ngram:2", num_beams=2), "num_beams must be 1, got 2"),
])
def test_bad_input_is_named(target, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        md(target, prompt(0, 5), max_new_tokens=4, **kwargs)


def test_length_processors_refused_for_batches(target):
    with pytest.raises(ValueError, match="Min(NewTokens)?LengthLogitsProcessor reads each row's length"):
        md(target, prompt(0, 5, batch=2), drafter="ngram:2", min_new_tokens=3, max_new_tokens=6)
    md(target, prompt(0, 5), drafter="ngram:2", min_new_tokens=3, max_new_tokens=6)  # one row: exact


@pytest.mark.parametrize("kwargs", [dict(repetition_penalty=1.5), dict(no_repeat_ngram_size=2),
                                    dict(logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(
                                        1.5, prompt_ignore_length=5)]))])
def test_whole_row_processors_refused_for_batches(target, kwargs):
    """They would count the pad tokens of a row that fell behind (transformers' rows have none)."""
    with pytest.raises(ValueError, match="reads each row's length or padding"):
        md(target, prompt(0, 5, batch=2), drafter="ngram:2", do_sample=False, max_new_tokens=4, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(guidance_scale=1.5)])
def test_stateful_processors_refused(target, kwargs):
    """Classifier-free guidance keeps a cache across calls, one call per token; the engine calls it per position."""
    with pytest.raises(ValueError, match="keeps state from one call to the next"):
        md(target, prompt(0, 5), drafter="ngram:2", do_sample=False, max_new_tokens=4, **kwargs)


def test_a_direct_call_takes_sampling_and_eos_from_the_config():
    """As generate builds them from the config (the direct call once ignored EOS and sampling)."""
    from mdboost.hf import mentored_generate
    from mdboost.models.tiny import tiny_llama

    target = tiny_llama(vocab_size=32, num_layers=1)
    ids = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4]])
    free = target.generate(ids, do_sample=False, max_new_tokens=8, pad_token_id=0)
    eos = int(free[0, ids.shape[1] + 3])  # the greedy continuation's 4th token
    expected = target.generate(ids, do_sample=False, max_new_tokens=8, eos_token_id=eos, pad_token_id=0)
    cfg = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=0)
    out = mentored_generate(target, ids, generation_config=cfg, drafter="ngram:2")
    assert out.tolist() == expected.tolist() and out.shape[1] < free.shape[1]
    one = GenerationConfig(max_new_tokens=8, do_sample=True, temperature=0.5, top_k=1, pad_token_id=0)  # top-1: greedy
    for seed in range(3):
        out = mentored_generate(target, ids, generation_config=one, drafter="ngram:2",
                                generator=torch.Generator().manual_seed(seed))
        assert out.tolist() == free.tolist()


def test_cache_implementation_is_ignored_with_a_warning(target, other):
    """mdboost's engine keeps its own dynamic cache: a requested cache implementation is not used,
    and the call says so instead of dropping it silently; the tokens are those of the call without it."""
    ids = prompt(3, 5)
    with pytest.warns(UserWarning, match="cache_implementation='static' is ignored"):
        out = md(target, ids, drafter=other, do_sample=False, max_new_tokens=6, cache_implementation="static")
    assert torch.equal(out, md(target, ids, drafter=other, do_sample=False, max_new_tokens=6))


def test_a_rule_runs_through_generate_as_in_the_engine(target, other):
    """``rule=`` reaches the engine: the same tokens as the engine with the same rule and seed."""
    ids = prompt(7, 6, batch=3)
    rule = Threshold(accept=0.5)
    ours = md(target, ids, drafter=other, rule=rule, do_sample=True, max_new_tokens=8, num_draft_tokens=3,
              generator=torch.Generator().manual_seed(4))
    settings = GenerationSettings(max_new_tokens=8, gamma=3, temperature=1.0, rule=rule, eos_token_id=EOS_ID,
                                  pad_token_id=PAD_ID)
    engine = generate(target, ids, settings, drafter=ModelDrafter(other), generator=torch.Generator().manual_seed(4))
    assert torch.equal(ours, engine.sequences)
