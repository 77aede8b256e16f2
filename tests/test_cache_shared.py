"""Shared sampled continuations: sampled once from the target, every member teacher-forced on
exactly those token rows; reused on rebuilds; other sequences mean a rebuild."""

import pytest
import torch
from safetensors.torch import load_file

from mdboost.cache import LogitCache
from mdboost.cache import build as build_module
from mdboost.cache.build import build_cache, member_logits, sample_sequences
from mdboost.cache.settings import RunOptions, SequenceSettings, StoreSettings
from mdboost.cache.manifest import atomic_save_tensors
from mdboost.models.pool import build_pool
from tests.test_rank_pipeline import _config as rank_config

RECORDS = [{"id": f"r{i}", "prompt": f"def g{i}(a):\n    b = a * {i}\n", "reference": "    return b\n"} for i in range(3)]


@pytest.fixture(scope="module")
def pool():
    return build_pool("tiny", ["early_exit:2", "ngram:2"])


def _sampled(max_new_tokens: int, seed: int = 0) -> SequenceSettings:
    return SequenceSettings(source="sampled", max_new_tokens=max_new_tokens, seed=seed)


def _count_sampling(monkeypatch) -> list:
    calls = []
    real = build_module.sample_continuation

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(build_module, "sample_continuation", counting)
    return calls


def test_members_share_the_sampled_rows(pool, tmp_path, monkeypatch):
    calls = _count_sampling(monkeypatch)
    path, digest = sample_sequences(pool, RECORDS, tmp_path / "cont" / "tokens.safetensors", _sampled(6, seed=3))
    assert len(calls) == len(RECORDS)
    dirs = {}
    for name in ("tiny", "early_exit:2", "ngram:2"):
        dirs[name] = build_cache(pool, RECORDS, tmp_path / name, StoreSettings(k=4), _sampled(6, seed=3), members=[name],
                                 tokens_file=path, run=RunOptions(progress=False))
    assert len(calls) == len(RECORDS)  # building members never samples
    stored = load_file(str(path))
    for name, folder in dirs.items():
        cache = LogitCache.open(folder)
        assert cache.manifest["sequences_sha256"] == digest
        assert torch.equal(cache.true_tokens(), stored["true_next"])
        assert (folder / "tokens.safetensors").read_bytes() == path.read_bytes()
    # teacher-forced on the stored ids: the drafter's cached logits are one forward over them
    cache = LogitCache.open(dirs["early_exit:2"])
    ids, start = cache.sequence(1)
    logits = member_logits(pool["early_exit:2"].model, ids, start)
    rows = torch.nonzero(cache.row_sequence() == 1).squeeze(1)
    _, top = cache.topk("early_exit:2", rows)
    torch.testing.assert_close(top.float(), logits.topk(4, dim=-1).values, atol=2e-2, rtol=2e-3)


def test_same_seed_reuses_the_stored_continuations(pool, tmp_path, monkeypatch):
    path = tmp_path / "tokens.safetensors"
    _, first = sample_sequences(pool, RECORDS, path, _sampled(5))
    calls = _count_sampling(monkeypatch)
    _, again = sample_sequences(pool, RECORDS, path, _sampled(5))
    assert again == first and calls == []
    # a fresh sampling with the same seed reproduces the file byte for byte
    _, fresh = sample_sequences(pool, RECORDS, tmp_path / "other.safetensors", _sampled(5))
    assert fresh == first and len(calls) == len(RECORDS)


def test_tokens_file_argument_errors(pool, tmp_path):
    with pytest.raises(ValueError, match="tokens_file must be a finished token file"):
        build_cache(pool, RECORDS, tmp_path / "a", sequences=_sampled(4), members=["tiny"], tokens_file=tmp_path / "none")
    path, _ = sample_sequences(pool, RECORDS[:2], tmp_path / "t.safetensors", _sampled(4))
    with pytest.raises(ValueError, match="holds 2 sequences, records has 3"):
        build_cache(pool, RECORDS, tmp_path / "b", sequences=_sampled(4), members=["tiny"], tokens_file=path)
    with pytest.raises(ValueError, match="sequences.source must be 'sampled'.*got 'reference'"):
        sample_sequences(pool, RECORDS, tmp_path / "r.safetensors", SequenceSettings())


def test_pipeline_samples_once_and_reuses(tmp_path, monkeypatch):
    from mdboost.cache import open_or_build_cache

    cfg = rank_config(tmp_path, pool={"pairs": "target"}, data={"limit": 2},
                      cache={"acceptance_source": "sampled", "acceptance_max_new_tokens": 5})
    spec = cfg.cache_spec()
    calls = _count_sampling(monkeypatch)
    pc, info = open_or_build_cache(spec)
    assert len(calls) == 2  # one continuation per record, not per member
    assert info.sampled_continuations == 1 and sorted(info.built_acceptance) == sorted(["tiny", *cfg.pool.drafters])
    stored = load_file(str(spec.continuations_path(5)))
    rows = {name: c.true_tokens() for name, c in pc.acceptance.caches.items()}
    assert all(torch.equal(r, stored["true_next"]) for r in rows.values())
    _, info2 = open_or_build_cache(spec)
    assert len(calls) == 2 and info2.reused and not info2.measured_speed_profile
    # other sequences under the same key (e.g. another torch's sampler): every acceptance folder is rebuilt
    tokens = dict(stored)
    tokens["true_next"] = tokens["true_next"].flip(0)
    tokens["ids"] = tokens["ids"].clone()
    for a, b, s in zip(tokens["seq_offsets"][:-1].tolist(), tokens["seq_offsets"][1:].tolist(), tokens["starts"].tolist()):
        tokens["ids"][a + s:b] = tokens["ids"][a + s:b].flip(0)
    tokens["true_next"] = torch.cat([tokens["ids"][a + s:b] for a, b, s in zip(
        tokens["seq_offsets"][:-1].tolist(), tokens["seq_offsets"][1:].tolist(), tokens["starts"].tolist())])
    atomic_save_tensors(tokens, spec.continuations_path(5))
    pc3, info3 = open_or_build_cache(spec)
    assert sorted(info3.built_acceptance) == sorted(["tiny", *cfg.pool.drafters]) and info3.built == ()
    assert torch.equal(pc3.acceptance.true_tokens(), tokens["true_next"])
    assert spec.member_dir("tiny", acceptance=True).is_dir()


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_sample_continuation_equals_a_no_cache_reference(pool, temperature):
    """The engine's AR loop draws what a plain loop (full forward per token, one multinomial per
    token from the same CPU generator) draws, and stops after EOS."""
    from mdboost.md.probs import logits_to_probs

    model, prompt = pool.target.model, torch.tensor([5, 9, 14, 3, 22])
    eos = int(model(prompt[None]).logits[0, -1].argmax())  # greedy: EOS on the first token
    for stop in (None, eos):
        gen, ref_gen = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
        out = build_module.sample_continuation(model, prompt, 12, temperature, gen, stop)
        ids, ref = prompt.clone(), []
        with torch.no_grad():
            while len(ref) < 12 and (not ref or ref[-1] != stop):
                probs = logits_to_probs(model(ids[None]).logits[0, -1], temperature)
                token = int(probs.argmax()) if temperature == 0 else int(torch.multinomial(probs, 1, generator=ref_gen))
                ref.append(token)
                ids = torch.cat([ids, torch.tensor([token])])
        assert out.tolist() == ref
        assert torch.equal(gen.get_state(), ref_gen.get_state())
    assert build_module.sample_continuation(model, prompt, 12, 0.0, gen, eos).tolist() == [eos]
