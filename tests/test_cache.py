"""Logit cache: equals direct forward passes, resumes byte-identically, detects corruption,
bounds the top-k approximation against the full path, runs under Dask."""

import dataclasses
import re
import shutil

import pytest
import torch

from mdboost.cache import CacheCorruptionError, LogitCache, RunOptions, SequenceSettings, StoreSettings, build_cache
from mdboost.cache import build as build_module
from mdboost.md.probs import logits_to_probs
from mdboost.models.ngram import NgramDrafter
from mdboost.models.pool import build_pool
from mdboost.ranking.support import pair_probs

RECORDS = [
    {"id": f"r{i}", "prompt": f"def f{i}(x):\n    y = x + {i}\n", "reference": f"    return y * {i} + y\n"}
    for i in range(5)
]
K = 6
STORE = StoreSettings(k=K, dtype="float32", keep_full=True, shard_size=2, temperatures=(0.5,))


@pytest.fixture(scope="module")
def pool():
    return build_pool("tiny", ["early_exit:2", "ngram:2"])


@pytest.fixture(scope="module")
def cache_dir(pool, tmp_path_factory):
    out = tmp_path_factory.mktemp("cache")
    build_cache(pool, RECORDS, out, STORE)
    return out


def files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix == ".safetensors"}


def test_cache_equals_direct_forward(pool, cache_dir):
    cache = LogitCache.open(cache_dir)
    assert cache.members == ["tiny", "early_exit:2", "ngram:2"] and cache.num_sequences == 5
    row = 0
    for s in range(cache.num_sequences):
        ids, start = cache.sequence(s)
        rows = torch.arange(row, row + ids.numel() - start)
        for name in ("tiny", "early_exit:2"):
            with torch.no_grad():
                logits = pool[name].model(ids[None]).logits[0, start - 1:-1]  # [r, V]
            top_ids, top_logits = cache.topk(name, rows)
            torch.testing.assert_close(top_logits, logits.topk(K).values, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(logits.gather(1, top_ids), top_logits, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(cache.logsumexp(name, rows), logits.logsumexp(-1), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(cache.logsumexp(name, rows, 0.5), (logits / 0.5).logsumexp(-1), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(cache.true_logit(name, rows), logits.gather(1, ids[start:, None])[:, 0])
            torch.testing.assert_close(cache.logit_sum(name, rows), logits.sum(-1), atol=1e-4, rtol=1e-5)
            torch.testing.assert_close(cache.full_logits(name, rows), logits.half().float())
        assert torch.equal(cache.true_tokens()[rows], ids[start:])
        assert torch.equal(cache.row_position()[rows], torch.arange(start, ids.numel()))
        expected = NgramDrafter(2).propose_all(ids, 4)[start - 1:-1]
        assert torch.equal(cache.ngram_proposals("ngram:2", rows), expected)
        row += ids.numel() - start
    assert row == cache.num_rows and torch.equal(cache.row_sequence()[-1:], torch.tensor([4]))


def test_manifest_records_the_build(pool, cache_dir):
    m = LogitCache.open(cache_dir).manifest
    assert m["k"] == K and m["dtype"] == "float32" and m["source"] == "reference" and m["complete"]
    assert m["tokenizer_fingerprint"] == pool.target.vocab_fingerprint and len(m["dataset_fingerprint"]) == 64
    assert m["code_version"].startswith("mdboost") and m["record_ids"] == [r["id"] for r in RECORDS]
    assert {info["model_id"] for info in m["members"]} == {"tiny", "tiny#early_exit:2", "tiny#ngram:2"}
    assert all(len(info["sha256"]) == 64 for info in m["shards"].values())


@pytest.mark.parametrize("temperature, tail", [(1.0, "drop"), (1.0, "uniform"), (0.5, "uniform"), (0.5, "drop")])
def test_topk_acceptance_error_is_bounded_by_tail_masses(cache_dir, temperature, tail):
    cache = LogitCache.open(cache_dir)
    pair = pair_probs(cache, "early_exit:2", "tiny", temperature=temperature, tail=tail)
    torch.testing.assert_close(pair.draft_probs.sum(-1), torch.ones(cache.num_rows), atol=1e-5, rtol=0)
    exact = torch.minimum(cache.probs("early_exit:2", temperature=temperature, tail="full"),
                          cache.probs("tiny", temperature=temperature, tail="full")).sum(-1)
    tails = [cache.kept_probs(m, temperature=temperature, tail="uniform")[2] for m in ("early_exit:2", "tiny")]
    assert (tails[0] > 0.01).any()  # the bound is not vacuous: the top-k misses real mass
    assert ((pair.acceptance() - exact).abs() <= tails[0] + tails[1] + 2e-3).all()  # 2e-3: fp16 full logits
    dense = torch.minimum(cache.probs("early_exit:2", None, temperature, tail), cache.probs("tiny", None, temperature, tail)).sum(-1)
    torch.testing.assert_close(dense, pair.acceptance(), atol=1e-5, rtol=0)


def test_drop_tail_is_top_k_processing(pool, cache_dir):
    cache = LogitCache.open(cache_dir)
    with torch.no_grad():
        logits = torch.cat([pool.target.model(ids[None]).logits[0, start - 1:-1]
                            for ids, start in map(cache.sequence, range(cache.num_sequences))])
    expected = logits_to_probs(logits, 0.7, top_k=K)
    torch.testing.assert_close(cache.probs("tiny", temperature=0.7, tail="drop"), expected, atol=2e-3, rtol=0)


def test_ngram_pairs_are_one_hot(cache_dir):
    cache = LogitCache.open(cache_dir)
    pair = pair_probs(cache, "ngram:2", "tiny")
    proposals = cache.ngram_proposals("ngram:2")[:, 0]
    assert torch.equal(pair.valid, proposals >= 0) and pair.valid.any()
    target = cache.probs("tiny")
    rows = pair.valid.nonzero()[:, 0]
    torch.testing.assert_close(pair.acceptance()[rows], target[rows, proposals[rows]])


def test_reader_errors(cache_dir, tmp_path, pool):
    cache = LogitCache.open(cache_dir)
    with pytest.raises(ValueError, match="member"):
        cache.topk("nope")
    with pytest.raises(ValueError, match="temperature"):
        cache.logsumexp("tiny", temperature=0.3)
    with pytest.raises(ValueError, match="rows"):
        cache.topk("tiny", [cache.num_rows])
    with pytest.raises(ValueError, match="ngram"):
        cache.ngram_proposals("tiny")
    small = build_cache(pool, RECORDS[:1], tmp_path / "s", StoreSettings(k=2), members=["tiny"])
    with pytest.raises(ValueError, match="keep_full"):
        LogitCache.open(small).full_logits("tiny")
    with pytest.raises(ValueError, match="not a logit cache"):
        LogitCache.open(tmp_path)


def test_interrupted_build_resumes_byte_identical(pool, cache_dir, tmp_path, monkeypatch):
    calls = {"n": 0}
    original = build_module.compute_shard

    def flaky(member, seqs, store):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt("simulated crash")
        return original(member, seqs, store)

    monkeypatch.setattr(build_module, "compute_shard", flaky)
    with pytest.raises(KeyboardInterrupt):
        build_cache(pool, RECORDS, tmp_path, STORE)
    with pytest.raises(ValueError, match="unfinished"):
        LogitCache.open(tmp_path)
    assert not list(tmp_path.glob(".*.tmp"))  # no temp file left behind
    done = {p.name for p in tmp_path.glob("*.safetensors")}
    calls["n"] = -100
    build_cache(pool, RECORDS, tmp_path, STORE)
    assert calls["n"] == -100 + 9 - (len(done) - 1)  # only the unfinished shards were computed
    assert files(tmp_path) == files(cache_dir)


def test_corrupted_shard_is_detected_and_rebuilt(pool, cache_dir, tmp_path):
    out = tmp_path / "c"
    shutil.copytree(cache_dir, out)
    shard = out / "early_exit_2-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CacheCorruptionError, match="early_exit_2-00001"):
        LogitCache.open(out)
    build_cache(pool, RECORDS, out, STORE)
    assert files(out) == files(cache_dir)
    LogitCache.open(out)


def test_other_configuration_is_refused_unless_overwrite(pool, cache_dir, tmp_path):
    out = tmp_path / "c"
    shutil.copytree(cache_dir, out)
    with pytest.raises(ValueError, match="another configuration"):
        build_cache(pool, RECORDS, out, dataclasses.replace(STORE, k=K + 1))
    build_cache(pool, RECORDS[:2], out, StoreSettings(k=3), members=["tiny"], run=RunOptions(overwrite=True))
    assert LogitCache.open(out).k == 3


def test_sampled_source_is_deterministic(pool, tmp_path):
    sampled = SequenceSettings(source="sampled", max_new_tokens=8)
    a, b, c = (build_cache(pool, RECORDS[:3], tmp_path / name, StoreSettings(k=3), seqs, members=["tiny"])
               for name, seqs in (("a", sampled), ("b", dataclasses.replace(sampled, seed=0)),
                                  ("c", dataclasses.replace(sampled, seed=1))))
    assert files(a) == files(b) and files(a) != files(c)
    cache = LogitCache.open(a)
    assert cache.manifest["source"] == "sampled" and cache.manifest["sample_temperature"] == 1.0
    ids, start = cache.sequence(0)
    assert 1 <= ids.numel() - start <= 8


@pytest.mark.parametrize("settings, field, value", [
    (StoreSettings, "k", 0), (StoreSettings, "k", 2.5), (StoreSettings, "dtype", "int8"),
    (StoreSettings, "k", float("nan")), (StoreSettings, "shard_size", float("inf")),  # were int()'s own errors
    (StoreSettings, "temperatures", ("0.5",)),  # was float()'s own error
    (StoreSettings, "keep_full", "no"), (SequenceSettings, "chat_template", "false"),  # were True
    (StoreSettings, "shard_size", 0), (StoreSettings, "temperatures", (0.0,)), (StoreSettings, "ngram_lookahead", 0),
    (SequenceSettings, "source", "web"), (SequenceSettings, "max_tokens", 0),
    (SequenceSettings, "max_tokens", 1),  # was accepted; the build then wrote a manifest and failed in encode_record
    (SequenceSettings, "max_new_tokens", 1.5),
    (SequenceSettings, "sample_temperature", -1.0), (SequenceSettings, "seed", -1), (SequenceSettings, "system", 3),
    (StoreSettings, "temperatures", (float("inf"),)), (SequenceSettings, "sample_temperature", float("inf")),  # accepted
    (RunOptions, "n_jobs", 0), (RunOptions, "backend", ""),
])
def test_bad_build_settings_name_the_field_and_value(settings, field, value):
    shown = repr(value[0] if field == "temperatures" else value)
    with pytest.raises(ValueError, match=f"^{field} .*got {re.escape(shown)}"):
        settings(**{field: value})


def test_no_records_is_refused_before_the_folder_is_made(pool, tmp_path):
    with pytest.raises(ValueError, match="^records must hold at least one record, got none$"):
        build_cache(pool, [], tmp_path / "c", StoreSettings(k=3))  # was: a "complete" cache that torch.cat refused to read
    with pytest.raises(ValueError, match="^records must hold at least one record"):
        build_module.sample_sequences(pool, [], tmp_path / "s" / "tokens.safetensors", SequenceSettings(source="sampled"))
    assert not (tmp_path / "c").exists() and not (tmp_path / "s").exists()
    assert LogitCache.open(build_cache(pool, iter(RECORDS[:1]), tmp_path / "g", StoreSettings(k=3))).num_sequences == 1


def test_temperatures_must_be_a_sequence():
    for bad in (0.5, None, "0.5"):  # were a TypeError "not iterable", and float("0")'s error for the letters
        with pytest.raises(ValueError, match=f"^temperatures must be a sequence of numbers > 0, got {re.escape(repr(bad))}"):
            StoreSettings(temperatures=bad)
    with pytest.raises(ValueError, match=r"for one temperature: \(0.5,\)"):
        StoreSettings(temperatures=0.5)


def test_store_settings_normalize_what_the_manifest_records():
    store = StoreSettings(k=16.0, temperatures=[2, 0.5, 1.0, 2.0], keep_full=1)
    assert (store.k, store.temperatures, store.keep_full) == (16, (0.5, 1.0, 2.0), True)
    assert store.manifest_entries()["temperatures"] == [0.5, 1.0, 2.0]  # a JSON list, as read back
    assert "seed" not in SequenceSettings().manifest_entries()  # sampling settings only for sampled sequences
    assert SequenceSettings(source="sampled", seed=4).manifest_entries()["seed"] == 4


def test_threading_and_dask_backends_match_sequential(pool, cache_dir, tmp_path):
    distributed = pytest.importorskip("distributed")
    build_cache(pool, RECORDS, tmp_path / "t", STORE, run=RunOptions(backend="threading", n_jobs=2))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        with distributed.Client(cluster):
            build_cache(pool, RECORDS, tmp_path / "d", STORE, run=RunOptions(backend="dask", n_jobs=2))
    for name in ("t", "d"):
        a, b = LogitCache.open(tmp_path / name), LogitCache.open(cache_dir)
        for member in ("tiny", "early_exit:2"):
            torch.testing.assert_close(a.topk(member)[1], b.topk(member)[1], atol=1e-5, rtol=1e-5)
            assert torch.equal(a.topk(member)[0], b.topk(member)[0])
        assert torch.equal(a.ngram_proposals("ngram:2"), b.ngram_proposals("ngram:2"))
