"""Faults: a build SIGKILLed at fixed file operations resumes byte-identical and leaves no
temporary file; every kind of damage to a folder is refused when read (never served) and
rebuilt by a resumed build."""

import json
import os

import pytest

from mdboost.cache import CacheCorruptionError, LogitCache, RunOptions, StoreSettings, build_cache
from mdboost.cache.manifest import MANIFEST
from mdboost.models.pool import build_pool
from tests._cache_faults import CORRUPTIONS, RECORDS, damaged_copy, folder_state, killed_build, temp_files

STORE = StoreSettings(k=6, dtype="float32", keep_full=True, shard_size=2, temperatures=(0.5,))
RUN = RunOptions(progress=False)
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="kills a forked build")


@pytest.fixture(scope="module")
def pool():
    return build_pool("tiny", ["early_exit:2", "ngram:2"])


@pytest.fixture(scope="module")
def clean(pool, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "cache"
    build_cache(pool, RECORDS, out, STORE, run=RUN)
    return out


def _replaces(pool, tmp_path) -> int:
    """How many renames a clean build makes (every file lands by ``os.replace``)."""
    calls, real = [0], os.replace

    def counting(*a, **k):
        calls[0] += 1
        return real(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "replace", counting)
        build_cache(pool, RECORDS, tmp_path / "count", STORE, run=RUN)
    return calls[0]


# the first manifest; the token file before its rename and after it (no sidecar yet); the first
# shard left half written; a shard renamed without its sidecar; a sidecar written before the
# manifest lists its shard; halfway; the final manifest
KILL_POINTS = [(1, "before"), (2, "before"), (2, "after"), (1, "mid-write"), (5, "after"), (6, "after"),
               (16, "before"), (-1, "before")]


@pytest.mark.parametrize("kill_at,when", KILL_POINTS, ids=[f"{w}-{k}" for k, w in KILL_POINTS])
def test_killed_build_resumes_byte_identical(pool, clean, tmp_path, kill_at, when):
    out = tmp_path / "cache"
    if kill_at < 0:
        kill_at += _replaces(pool, tmp_path) + 1
    assert killed_build(lambda: build_cache(pool, RECORDS, out, STORE, run=RUN), kill_at, when)
    if when in ("before", "mid-write"):
        assert len(temp_files(out)) == 1  # what the kill left behind
    with pytest.raises(ValueError, match="unfinished|not a logit cache"):
        LogitCache.open(out)
    build_cache(pool, RECORDS, out, STORE, run=RUN)
    assert temp_files(out) == []
    assert folder_state(out) == folder_state(clean)
    LogitCache.open(out).topk("early_exit:2")


def test_a_stale_temp_file_in_a_finished_folder_is_removed(pool, clean, tmp_path):
    out = damaged_copy(clean, tmp_path / "c", "shard bit flipped")
    (out / ".manifest.json.k1l2l3.tmp.json").write_text("{")  # a kill while the manifest was rewritten
    build_cache(pool, RECORDS, out, STORE, run=RUN)
    assert temp_files(out) == [] and folder_state(out) == folder_state(clean)


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_damage_is_refused_then_rebuilt(pool, clean, tmp_path, kind):
    out = damaged_copy(clean, tmp_path / "c", kind)
    with pytest.raises(ValueError) as err:  # CacheCorruptionError, or "not a logit cache" without a manifest
        cache = LogitCache.open(out)
        cache.topk("early_exit:2"), cache.probs("tiny", tail="full")
    assert isinstance(err.value, CacheCorruptionError) or (out / MANIFEST).exists() is False, err.value
    assert str(out) in str(err.value)
    build_cache(pool, RECORDS, out, STORE, run=RunOptions(progress=False, overwrite=True))
    assert folder_state(out) == folder_state(clean)
    LogitCache.open(out)


@pytest.mark.parametrize("kind", ["manifest truncated", "manifest shard_size edited", "manifest complete flag edited"])
def test_a_damaged_manifest_is_reported_without_overwrite(pool, clean, tmp_path, kind):
    out = damaged_copy(clean, tmp_path / "c", kind)
    with pytest.raises(CacheCorruptionError, match="manifest.json"):
        build_cache(pool, RECORDS, out, STORE, run=RUN)


def test_a_truncated_manifest_is_a_clear_error_not_a_json_error(clean, tmp_path):
    out = damaged_copy(clean, tmp_path / "c", "manifest truncated")
    with pytest.raises(CacheCorruptionError, match="not valid JSON"):
        LogitCache.open(out)


def test_the_manifest_checksum_is_checked_and_old_manifests_still_open(clean, tmp_path):
    out = damaged_copy(clean, tmp_path / "c", "shard deleted")
    (out / "early_exit_2-00001.safetensors").write_bytes((clean / "early_exit_2-00001.safetensors").read_bytes())
    data = json.loads((out / MANIFEST).read_text())
    data.pop("manifest_sha256")  # as written before manifests carried their checksum
    (out / MANIFEST).write_text(json.dumps(data))
    assert LogitCache.open(out).num_rows == LogitCache.open(clean).num_rows


def test_a_build_waits_for_the_folder_lock_then_leaves_a_finished_folder_alone(pool, clean, tmp_path):
    import shutil
    import threading

    from mdboost._io import file_lock, lock_path

    out = tmp_path / "cache"
    shutil.copytree(clean, out)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    (out / "early_exit_2-00001.safetensors").unlink()  # something to rebuild
    worker = threading.Thread(target=build_cache, args=(pool, RECORDS, out, STORE), kwargs={"run": RUN})
    with file_lock(lock_path(out)):  # another process building this folder
        worker.start()
        worker.join(1.0)
        assert worker.is_alive() and not (out / "early_exit_2-00001.safetensors").exists()
    worker.join(60)
    assert folder_state(out) == folder_state(clean)
    again = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    build_cache(pool, RECORDS, out, STORE, run=RUN)  # finished: nothing rewritten
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == again and set(again) == set(before)
