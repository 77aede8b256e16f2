"""The llama.cpp backend (mdboost.engine.llamacpp): the engine's loop with llama.cpp doing the forward passes.

Two layers of checks:

- without llama-cpp-python: :class:`LlamaCppLM` driven over a stand-in for ``llama_cpp.Llama``'s
  context and batch (the calls llama.py's ``Llama.eval`` makes), whose logits are a tiny
  transformers model's full forward over the tokens the stand-in holds; the engine then emits
  what it emits with that model directly (AR, SD and MD, same generator): the chunking, the
  flagged positions and the rollback are right;
- with llama-cpp-python (``pip install 'mdboost[llamacpp]'``; skipped with the reason without it):
  the default GGUF through the backend, greedy, token-identical to llama-cpp-python's own
  ``Llama.generate``, and lossless SD (prompt lookup, the GGUF as its own drafter) identical to it.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from mdboost.engine import GenerationSettings, ModelDrafter, NgramAdapter, generate
from mdboost.engine.llamacpp import LlamaCppModel, llama_cpp_available
from mdboost.models.ngram import NgramDrafter
from mdboost.models.tiny import tiny_llama


class _Batch:
    """``llama_cpp._internals.LlamaBatch``: ``set_batch`` and the ``batch.logits`` flags."""

    def __init__(self):
        self.batch = type("llama_batch", (), {})()

    def set_batch(self, batch, n_past, logits_all):  # _internals.py 507-516 in 0.3.36
        self.tokens, self.n_past = list(batch), n_past
        self.batch.logits = [bool(logits_all)] * len(batch)
        self.batch.logits[-1] = True


class _Context:
    """``llama_cpp._internals.LlamaContext``: a KV cache of token ids; each decode computes the
    flagged positions' logits with a full forward of ``model`` over the cached tokens."""

    def __init__(self, model):
        self.model, self.cached, self.decodes, self._out = model, [], [], None

    def kv_cache_seq_rm(self, seq_id, p0, p1):
        assert seq_id == -1 and p1 == -1
        del self.cached[p0:]
        return True

    def decode(self, batch: _Batch):
        assert batch.n_past == len(self.cached), "positions must continue the cache"
        self.cached += batch.tokens
        self.decodes.append((len(batch.tokens), sum(batch.batch.logits)))
        with torch.no_grad():
            logits = self.model(torch.tensor([self.cached])).logits[0, -len(batch.tokens):].float().numpy()
        self._out = np.ascontiguousarray(logits[np.array(batch.batch.logits)])

    def get_logits(self):
        return self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


class _FakeLlama:
    def __init__(self, model, n_batch=5, n_ctx=256):
        self._ctx, self._batch, self.n_batch, self._n_ctx = _Context(model), _Batch(), n_batch, n_ctx
        self._vocab = model.config.vocab_size
        self.n_tokens = 0

    def n_vocab(self):
        return self._vocab

    def n_ctx(self):
        return self._n_ctx


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(seed=3, num_layers=2)


PROMPT = torch.tensor([[5, 9, 14, 3, 22, 5, 9, 14, 3, 40, 7, 12]])


@pytest.mark.parametrize("mode", ["ar", "sd", "md", "md-model"])
def test_the_engine_on_the_backend_emits_what_it_emits_on_the_model(tiny, mode):
    """Same settings and generator: the tokens of the transformers path. The prompt (12 tokens)
    spans three decode batches of 5, and every drafted step rolls back."""
    backend = LlamaCppModel(llama=_FakeLlama(tiny))
    drafter = {"ar": None, "sd": NgramAdapter(NgramDrafter(2)), "md": NgramAdapter(NgramDrafter(2)),
               "md-model": ModelDrafter(LlamaCppModel(llama=_FakeLlama(tiny_llama(seed=4, num_layers=1))))}[mode]
    reference = drafter
    if mode == "md-model":  # the same drafter as a transformers model
        reference = ModelDrafter(tiny_llama(seed=4, num_layers=1))
    settings = GenerationSettings(max_new_tokens=20, gamma=3, temperature=0.8,
                                  max_divergence=0.3 if mode.startswith("md") else 0.0)
    got = generate(backend, PROMPT, settings, drafter=drafter, generator=torch.Generator().manual_seed(11))
    want = generate(tiny, PROMPT, settings, drafter=reference, generator=torch.Generator().manual_seed(11))
    assert got.sequences.tolist() == want.sequences.tolist()
    assert got.stats.num_new_tokens == 20
    if drafter is not None:
        assert got.stats.num_accepted_tokens == want.stats.num_accepted_tokens


def test_only_the_positions_read_pay_for_logits(tiny):
    backend = LlamaCppModel(llama=_FakeLlama(tiny, n_batch=5))
    lm = backend.open(1, "cpu")
    out = lm.forward(PROMPT, logits_to_keep=1)
    assert out.shape == (1, 1, tiny.config.vocab_size)
    # three batches (5, 5, 2): each flags only its last token (llama.cpp always returns that one)
    assert backend.llama._ctx.decodes == [(5, 1), (5, 1), (2, 1)]
    out = lm.forward(torch.tensor([[1, 2, 3, 4]]), logits_to_keep=4)
    assert out.shape == (1, 4, tiny.config.vocab_size) and backend.llama._ctx.decodes[-1] == (4, 4)
    with torch.no_grad():
        full = tiny(torch.cat([PROMPT, torch.tensor([[1, 2, 3, 4]])], 1)).logits[0, -4:]
    torch.testing.assert_close(out[0], full, atol=1e-5, rtol=1e-5)


def test_keep_rolls_back_to_the_kept_tokens(tiny):
    backend = LlamaCppModel(llama=_FakeLlama(tiny))
    lm = backend.open(1, "cpu")
    lm.forward(PROMPT, logits_to_keep=1)
    lm.keep([PROMPT.shape[1]])
    lm.forward(torch.tensor([[1, 2, 3]]), logits_to_keep=3)
    lm.keep([1])  # drafts 2 and 3 rejected
    assert backend.llama._ctx.cached == PROMPT[0].tolist() + [1] and lm.num_slots == PROMPT.shape[1] + 1
    out = lm.forward(torch.tensor([[8]]), logits_to_keep=1)
    with torch.no_grad():
        want = tiny(torch.tensor([PROMPT[0].tolist() + [1, 8]])).logits[0, -1]
    torch.testing.assert_close(out[0, -1], want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"num_columns must be 1 int in \[0, 1\], got \[2\]"):
        lm.keep([2])


def test_bad_input_is_named(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match="model_path .*missing.gguf.* is not a file"):
        LlamaCppModel(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="n_ctx must be an int >= 8, got 0"):
        LlamaCppModel(llama=_FakeLlama(tiny), n_ctx=0)
    with pytest.raises(TypeError, match="llama must be a llama_cpp.Llama, got str"):
        LlamaCppModel(llama="model.gguf")
    backend = LlamaCppModel(llama=_FakeLlama(tiny, n_ctx=16))
    with pytest.raises(ValueError, match="batch size 1.*got 2 prompts"):
        generate(backend, PROMPT.repeat(2, 1), GenerationSettings(max_new_tokens=2))
    with pytest.raises(ValueError, match="more than n_ctx=16"):
        generate(backend, PROMPT, GenerationSettings(max_new_tokens=8))


# --- with llama-cpp-python: the default GGUF ------------------------------------------------------

needs_llama = pytest.mark.skipif(not llama_cpp_available(),
                                 reason="llama-cpp-python is not installed (pip install 'mdboost[llamacpp]')")


@pytest.fixture(scope="module")
def gguf():
    from mdboost.models.convert import smollm2_gguf

    folder, name = smollm2_gguf()
    return str(folder / name)


@needs_llama
def test_greedy_tokens_equal_llama_cpp_python_s_own_generate(gguf):
    import llama_cpp

    own = llama_cpp.Llama(model_path=gguf, n_ctx=512, n_threads=1, verbose=False)
    backend = LlamaCppModel(gguf, n_ctx=512, n_threads=1)
    for text in (b"def fibonacci(n):", b"The capital of France is", b"import numpy as np\n"):
        prompt = own.tokenize(text)
        want = []
        for token in own.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            want.append(token)
            if len(want) == 24:
                break
        out = generate(backend, torch.tensor([prompt]), GenerationSettings(max_new_tokens=24, temperature=0))
        assert out.sequences[0, len(prompt):].tolist() == want, text


@needs_llama
def test_lossless_drafting_on_llama_cpp_keeps_the_greedy_output(gguf):
    """Lossless drafting emits the target's argmax at every position. llama.cpp scores a chunk of
    K + 1 tokens with other kernels than one token (its own speculative decoding shares this), so
    where the output leaves plain decoding's, the two tokens must be a near tie of the one-token
    logits there (measured on an AVX2 EPYC: 4 of 6 HumanEval prompts identical for llama-cpp-python's
    own prompt lookup and for mdboost's, bench/llamacpp.py)."""
    backend = LlamaCppModel(gguf, n_ctx=512, n_threads=1)
    prompt = backend.llama.tokenize(b"def add(a, b):\n    return a + b\n\ndef sub(a, b):")
    settings = GenerationSettings(max_new_tokens=32, temperature=0, gamma=4)
    plain = generate(backend, torch.tensor([prompt]), settings).sequences[0].tolist()
    for drafter in (NgramAdapter(NgramDrafter(3)), ModelDrafter(LlamaCppModel(gguf, n_ctx=512, n_threads=1))):
        out = generate(backend, torch.tensor([prompt]), settings, drafter=drafter)
        assert out.stats.num_accepted_tokens > 0
        got = out.sequences[0].tolist()
        if got != plain:
            i = next(j for j, (a, b) in enumerate(zip(got, plain)) if a != b)
            lm = backend.open(1, "cpu")  # as plain decoding scored it: the prompt at once, then one token a decode
            logits = lm.forward(torch.tensor([prompt]), logits_to_keep=1)[0, -1]
            for token in plain[len(prompt):i]:
                lm.keep([lm.last_fed])
                logits = lm.forward(torch.tensor([[token]]), logits_to_keep=1)[0, -1]
            gap = float(logits[plain[i]] - logits[got[i]])
            assert 0 <= gap < 1e-2 * float(logits.abs().max()), (drafter, i, gap)


def test_costs_are_measured_through_the_backend(tiny):
    """The cost measurement runs the engine's steps on the backend (costs engine ``llamacpp``):
    the target's profile times steps verifying ``K`` drafts as one ``K + 1``-token decode, the
    drafter's cost drafts with a GGUF drafter's own llama.cpp cache, and the prefill slope feeds
    the backend prompts of the lengths asked for."""
    from mdboost.engine.costs import measure_engine_cost, measure_engine_profile

    fake = _FakeLlama(tiny, n_batch=512)
    target = LlamaCppModel(llama=fake)
    profile = measure_engine_profile(target, 3, context_len=16, repeats=1, steps=1, warmup=0, prefill_lengths=(2, 9))
    assert len(profile.verify_cost) == 4 and all(v > 0 for v in profile.verify_cost)
    decoded = {size for size, _ in fake._ctx.decodes}
    assert {1, 2, 3, 4} <= decoded and {2, 9} <= decoded  # steps of K + 1 tokens; the prefill lengths
    drafter_fake = _FakeLlama(tiny_llama(seed=4, num_layers=1), n_batch=512)
    cost = measure_engine_cost(ModelDrafter(LlamaCppModel(llama=drafter_fake)), target, context_len=16, repeats=1,
                               steps=1, warmup=0, min_repeats=1, prefill_lengths=(2, 9))
    assert cost.samples[0] > 0 and cost.prefill_per_token >= 0 and drafter_fake._ctx.decodes


def test_a_generation_refuses_to_run_on_after_the_model_opened_another(tiny):
    """llama.cpp holds one cache per model: opening a second generation clears the first's, which
    then says so instead of computing on the wrong cache."""
    backend = LlamaCppModel(llama=_FakeLlama(tiny))
    first = backend.open(1, "cpu")
    first.forward(PROMPT[:, :4])
    second = backend.open(1, "cpu")
    second.forward(PROMPT[:, :2])
    for call in (lambda: first.forward(PROMPT[:, 4:6]), lambda: first.keep([0])):
        with pytest.raises(RuntimeError, match="opened another generation since this one"):
            call()
    second.keep([2])
    assert second.forward(PROMPT[:, 2:3]).shape == (1, 1, tiny.config.vocab_size)
