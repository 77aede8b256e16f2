"""Ranking and validating for llama.cpp (``speed.engine: llamacpp``): the costs' own speed file,
the config's checks, the pool as llama.cpp runs it, and validation runs on it.

Without llama-cpp-python the validation runs go through the stand-in ``llama_cpp.Llama`` of
``tests/test_llamacpp_backend.py`` (a tiny transformers model's forward behind llama.cpp's calls):
the cells then realize exactly what they realize on the torch models. With it (skipped with the
reason otherwise), the default GGUF's pool and the config's refusals.
"""

from __future__ import annotations

import pytest
import torch
import yaml

from mdboost.cache.keys import PoolCacheSpec
from mdboost.cache.profile import check_profile, hardware_fingerprint, hardware_label, pool_identity
from mdboost.cache.speed import SpeedStore, speed_path
from mdboost.data import TextSource
from mdboost.engine.llamacpp import LlamaCppMember, LlamaCppModel, LlamaCppPool, llama_cpp_available
from mdboost.models.gguf_drafters import llamacpp_cannot
from mdboost.models.pool import build_pool
from mdboost.validation.points import realize_cells
from tests.test_llamacpp_backend import _FakeLlama

needs_llama = pytest.mark.skipif(not llama_cpp_available(),
                                 reason="llama-cpp-python is not installed (pip install 'mdboost[llamacpp]')")


def _spec(tmp_path, **kw) -> PoolCacheSpec:
    return PoolCacheSpec(dir=str(tmp_path), text=TextSource(source="humaneval", limit=2), target="tiny",
                         drafters=("ngram:2",), **kw)


def test_llama_cpp_costs_have_their_own_speed_file(tmp_path):
    """Timings of llama.cpp's steps never answer for mdboost's engine, nor the other way round."""
    mdboost, llama = _spec(tmp_path), _spec(tmp_path, engine="llamacpp")
    assert speed_path(mdboost) != speed_path(llama)
    assert speed_path(mdboost) == speed_path(_spec(tmp_path, engine="mdboost"))


def test_a_profile_of_the_other_engine_is_refused(tmp_path):
    spec = _spec(tmp_path, engine="llamacpp")
    store = SpeedStore(tmp_path / "speed-x.json")
    store.identify(pool_identity(spec, "vocab-a"), hardware_fingerprint("cpu"))  # engine: mdboost's
    with pytest.raises(ValueError, match="times engine 'mdboost', the ranking's \\(speed.engine\\) is 'llamacpp'"):
        check_profile(store, spec, "vocab-a", 8)


def test_the_spec_refuses_what_llama_cpp_cannot_time(tmp_path):
    with pytest.raises(ValueError, match="engine must be one of .* got 'vllm'"):
        _spec(tmp_path, engine="vllm")
    with pytest.raises(ValueError, match="batch_sizes must be \\(1,\\) with engine 'llamacpp'"):
        _spec(tmp_path, engine="llamacpp", batch_sizes=(1, 4))


def test_the_hardware_names_llama_cpp_when_it_timed_the_steps():
    hardware = hardware_fingerprint("cpu", "llamacpp")
    assert "llama_cpp" in hardware and "llama_cpp" not in hardware_fingerprint("cpu")
    assert hardware_label(hardware).endswith(f"llama.cpp (llama-cpp-python {hardware['llama_cpp']})")


@pytest.mark.parametrize("spec, runs", [("early_exit:12", True), ("ngram:3", True), ("/m/d.gguf", True),
                                        ("tuned:12", False), ("int8", False), ("tiny", False)])
def test_which_drafters_llama_cpp_runs(spec, runs):
    assert (llamacpp_cannot(spec) is None) is runs


# --- validation on the backend: the cells realize what they realize on the torch models ---------

def _row(drafter: str, budget: float, gamma: int = 3) -> dict:
    return {"target": "tiny", "drafter": drafter, "temperature": "1.0", "divergence": "kl",
            "max_divergence": str(budget), "gamma": str(gamma), "md_solve": "needed", "cost_ratio": "0.3",
            "rule": "mentored", "drafting": "sampled"}


class _FakePool:
    """A :class:`LlamaCppPool`'s interface over the stand-in Llama of each torch member."""

    def __init__(self, pool, names):
        self._members = {}
        for name in names:
            member = pool[name]
            model = None if member.model is None else LlamaCppModel(llama=_FakeLlama(member.model, n_batch=512))
            self._members[name] = LlamaCppMember(name, member.kind, model, member.ngram)
        self.target = self._members[pool.target.name]

    def __getitem__(self, name):
        return self._members[name]


def test_cells_realized_on_the_backend_equal_those_on_the_models():
    """The backend's logits are the model's (the stand-in), so every count the engine keeps is the
    same; only the times differ."""
    pool = build_pool("tiny", ["early_exit:1", "ngram:2"], device="cpu")
    rows = [_row("early_exit:1", 0.0), _row("early_exit:1", 0.5), _row("ngram:2", 0.0, gamma=2)]
    prompts = [torch.tensor([5, 9, 5, 9, 5, 7]), torch.tensor([3, 4, 8, 3, 4])]
    on_models = realize_cells(rows, pool, prompts, max_new_tokens=12, seed=1)
    on_backend = realize_cells(rows, pool, prompts, max_new_tokens=12, seed=1,
                               engine_pool=_FakePool(pool, ["tiny", "early_exit:1", "ngram:2"]))
    for a, b in zip(on_models, on_backend):
        for key in ("realized_acceptance", "mean_accepted_length", "num_new_tokens", "nll_target_outputs",
                    "nll_target_ar_outputs"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
        assert b["realized_speedup"] > 0


# --- with llama-cpp-python: the default GGUF -----------------------------------------------------

@needs_llama
def test_the_pool_as_llama_cpp_runs_it(tmp_path):
    import gguf

    pool = LlamaCppPool("smollm2-135m", ["early_exit:12", "ngram:3"], home=tmp_path, n_ctx=256)
    assert pool.names == ["smollm2-135m", "early_exit:12", "ngram:3"]
    exit12 = pool["early_exit:12"]
    assert gguf.GGUFReader(exit12.model.model_path).get_field("llama.block_count").contents() == 12
    assert exit12.model.vocab_size == pool.target.model.vocab_size
    assert pool["ngram:3"].model is None and pool["ngram:3"].ngram.n == 3
    with pytest.raises(ValueError, match="drafter 'int8' cannot run in llama.cpp: torch's dynamic int8"):
        LlamaCppPool("smollm2-135m", ["int8"], home=tmp_path)
    with pytest.raises(ValueError, match="target 'tiny' cannot run in llama.cpp: 'tiny' is a random test model"):
        LlamaCppPool("tiny")
    with pytest.raises(KeyError, match="'tuned:12' is not in this llama.cpp pool"):
        pool["tuned:12"]


def _config(tmp_path, **speed) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out"), "speed": {"engine": "llamacpp", **speed},
                                    "pool": {"target": "smollm2-135m", "drafters": ["early_exit:12", "ngram:3"]}}))
    return str(path)


@needs_llama
def test_the_config_names_what_llama_cpp_cannot_rank(tmp_path):
    from pipelines.config import RankConfig
    from pipelines.loader import load_yaml

    cfg = load_yaml(_config(tmp_path), RankConfig, ())
    assert cfg.speed.batch_sizes == [1] and cfg.cache_spec().engine == "llamacpp"
    with pytest.raises(ValueError, match=r"speed.batch_sizes \(llama.cpp runs one sequence"):
        load_yaml(_config(tmp_path, batch_sizes=[1, 4]), RankConfig, ())
    with pytest.raises(ValueError, match=r"pool.drafters\[1\] \(speed.engine: llamacpp cannot run it: an early exit "
                                         r"with a tuned-lens"):
        load_yaml(_config(tmp_path), RankConfig, ("pool.drafters=[ngram:3, tuned:12]",))


def test_without_llama_cpp_the_config_says_how_to_install_it(tmp_path, monkeypatch):
    import pipelines.config as config
    from pipelines.loader import load_yaml

    monkeypatch.setattr(config, "llama_cpp_available", lambda: False)
    with pytest.raises(ValueError, match=r"speed.engine: llamacpp needs llama-cpp-python.*mdboost\[llamacpp\]"):
        load_yaml(_config(tmp_path), config.RankConfig, ())


def test_a_ranking_priced_in_llama_cpp_exports_its_loop_for_any_pick(tmp_path):
    from mdboost.export import llamacpp_snippet

    rec = {"beats_plain_decoding": True, "rule": "mentored", "drafting": "sampled", "max_divergence": 0.0,
           "divergence": "kl", "target": "/m/t.gguf", "drafter": "ngram:3", "temperature": 0.7, "gamma": 4}
    assert llamacpp_snippet(rec, {}) is None  # lossless, priced in mdboost: llama-server's
    code = llamacpp_snippet(rec, {}, "llamacpp")
    assert "NgramAdapter(NgramDrafter(3))" in code and "speed.engine: llamacpp" in code
    assert llamacpp_snippet(dict(rec, beats_plain_decoding=False), {}, "llamacpp") is None


@needs_llama
def test_the_shipped_llama_cpp_configs_load():
    """``configs/llamacpp.yaml`` ranks the default pool's cache (the same cache folder and data as
    ``configs/default.yaml``) with llama.cpp's costs; its validation config reads that ranking."""
    from pathlib import Path

    from pipelines.config import RankConfig
    from pipelines.loader import load_yaml
    from pipelines.validate_config import ValidateConfig

    repo = Path(__file__).resolve().parents[1]
    llama = load_yaml(str(repo / "configs/llamacpp.yaml"), RankConfig, ())
    default = load_yaml(str(repo / "configs/default.yaml"), RankConfig, ())
    assert llama.speed.engine == "llamacpp" and llama.speed.batch_sizes == [1]
    assert llama.cache_spec(0.7).member_dir("early_exit:12") == default.cache_spec(0.7).member_dir("early_exit:12")
    validate = load_yaml(str(repo / "configs/validate_llamacpp.yaml"), ValidateConfig, ())
    assert validate.ranking.ranking_dir == llama.output_dir
