"""Cache folder keys are a compatibility contract: the names below were computed by the code that
built users' caches (``mdboost/ranking/from_cache.py`` before the cache keys moved to
``mdboost/cache/keys.py``); a change here means every existing cache gets rebuilt. Only the
``int8`` folders moved since, twice: their rows were computed as the engine drafts, then the
drafter quantized each token's activations alone (``mdboost.models.pool.ROW_REVISIONS``), so
caches of the older rows must not be reused."""

import dataclasses

import pytest

from mdboost.cache.keys import SAMPLER, fingerprint
from pipelines.loader import load_yaml
from pipelines.config import RankConfig

PINNED = {
    "tiny": {
        "main": {
            "tiny": "tiny-1dc11f20b1956b24",
            "early_exit:2": "early_exit_2-29cb75f4c9627adb",
            "tuned:2": "tuned_2-ca561fea5fd13ad4",
            "int8": "int8-307511bdd662a6d1",
            "ngram:2": "ngram_2-eef45966168bdf49",
        },
        "acceptance": {
            "tiny": "tiny-3b2ed4c9935e2dd4",
            "early_exit:2": "early_exit_2-9e1884be8b31f52a",
            "tuned:2": "tuned_2-b828c9f9f7c609d7",
            "int8": "int8-cb93e95f7fd4c9a3",
            "ngram:2": "ngram_2-49a74f088bc7e18f",
        },
        "continuations": {
            "16": "continuations-1f862031c8eb4c0a",
            "128": "continuations-942b48715d250384",
        },
        "fingerprint": "4fb7de226e3f6fb6",
    },
    "default": {
        "main": {
            "smollm2-135m": "smollm2-135m-5820dabd2c1c9369",
            "early_exit:12": "early_exit_12-684c6461b255f3da",
            "early_exit:18": "early_exit_18-7112b26790859c29",
            "early_exit:24": "early_exit_24-2c597acf76a5b6c0",
            "early_exit:27": "early_exit_27-de4b3e4178416845",
            "tuned:12": "tuned_12-52f09a486948a715",
            "tuned:18": "tuned_18-d34d3ea90dbfce7f",
            "tuned:24": "tuned_24-06461b09b2505dcd",
            "tuned:27": "tuned_27-91ec7f05e294285a",
            "int8": "int8-554088ddb1e9e616",
            "ngram:3": "ngram_3-2f0fedbe72f00eea",
        },
        "acceptance": {
            "smollm2-135m": "smollm2-135m-3fac8f1eb7834cf3",
            "early_exit:12": "early_exit_12-2e9967035116a610",
            "early_exit:18": "early_exit_18-0f1e89719c5da289",
            "early_exit:24": "early_exit_24-201d46fc37047160",
            "early_exit:27": "early_exit_27-bfd81fc581b40337",
            "tuned:12": "tuned_12-0bd091e2359b1ee5",
            "tuned:18": "tuned_18-b1d501772e81c3b8",
            "tuned:24": "tuned_24-cf9b8098dd9fb069",
            "tuned:27": "tuned_27-3167f6ac593b7330",
            "int8": "int8-6e6b4dfc80485e70",
            "ngram:3": "ngram_3-80d4d7e59f4f5dc7",
        },
        "continuations": {
            "64": "continuations-f01eac56b4ec8498",
            "128": "continuations-35c58d29960aef07",
        },
        "fingerprint": "7ef69c16d4bd0e82",
    },
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_shipped_configs_keep_their_folder_names(name):
    spec = load_yaml(f"configs/{name}.yaml", RankConfig).cache_spec(1.0)  # the folders of T = 1
    pins = PINNED[name]
    assert {m: spec.member_dir(m).name for m in spec.names} == pins["main"]
    assert {m: spec.member_dir(m, acceptance=True).name for m in spec.names} == pins["acceptance"]
    assert {str(n): spec.continuations_path(n).parent.name for n in map(int, pins["continuations"])} == pins["continuations"]
    assert spec.fingerprint() == pins["fingerprint"]
    assert all(spec.member_dir(m).parent == spec.continuations_path(1).parent.parent for m in spec.names)


def test_sampler_key_unchanged():
    assert SAMPLER == "build_sequences/v1: per-record torch.Generator seeded by sha256(seed:id), KV-cached multinomial"


def test_keys_follow_the_stored_values_only():
    base = load_yaml("configs/tiny.yaml", RankConfig)
    spec = base.cache_spec(1.0)
    rebuilt = dataclasses.replace(spec, n_jobs=4, backend="threading", cost_repeats=1, gamma_max=3, device="meta")
    assert [rebuilt.member_dir(m) for m in spec.names] == [spec.member_dir(m) for m in spec.names]
    other_k = dataclasses.replace(spec, folders=dataclasses.replace(spec.folders, k=spec.folders.k + 1))
    assert all(other_k.member_dir(m) != spec.member_dir(m) for m in spec.names)
    warmer = dataclasses.replace(spec, temperature=0.7)
    assert warmer.continuations_path(16) != spec.continuations_path(16)
    # an int temperature keys like the float the YAML loader gives
    assert dataclasses.replace(spec, temperature=1).member_dir("tiny") == spec.member_dir("tiny")


def test_one_drafter_as_a_string_is_refused():
    from mdboost.cache.keys import PoolCacheSpec
    from mdboost.data import TextSource

    with pytest.raises(TypeError, match=r"^drafters must be a sequence of drafter specs, got str 'ngram:2' "
                                        r"\(for one drafter: \('ngram:2',\)\)$"):
        PoolCacheSpec(dir="x", text=TextSource(), target="tiny", drafters="ngram:2")  # was: drafters 'n', 'g', 'r', ...
    assert PoolCacheSpec(dir="x", text=TextSource(), target="tiny", drafters=["ngram:2"]).drafters == ("ngram:2",)


def test_fingerprint_hashes_dataclasses_as_their_fields():
    from mdboost.data import TextSource

    text = TextSource(limit=3)
    assert fingerprint(text) == fingerprint(dataclasses.asdict(text))
    assert fingerprint(text) != fingerprint(TextSource(limit=4))
    assert fingerprint((1, 2)) == fingerprint([1, 2])


def test_a_row_revision_moves_only_that_members_folders(monkeypatch):
    from mdboost.models import pool

    spec = load_yaml("configs/tiny.yaml", RankConfig).cache_spec(1.0)
    before = {m: spec.member_dir(m).name for m in spec.names}
    monkeypatch.setitem(pool.ROW_REVISIONS, "tuned", "rows: test revision")
    after = {m: spec.member_dir(m).name for m in spec.names}
    assert {m for m in spec.names if before[m] != after[m]} == {"tuned:2"}


def test_each_temperature_has_its_folders_and_t1_keeps_the_old_ones():
    cfg = load_yaml("configs/default.yaml", RankConfig)
    assert cfg.md.sampling_temperatures == [0.7, 1.0]
    cold, warm = cfg.cache_spec(0.7), cfg.cache_spec(1.0)
    assert all(cold.member_dir(m) != warm.member_dir(m) for m in cold.names)
    assert {m: warm.member_dir(m).name for m in warm.names} == PINNED["default"]["main"]


def test_mentored_continuations_keep_their_names():
    """The mentored rows files of the default pool (prompt lookup's budget points, T = 1), and the
    sampler version they are keyed on."""
    from mdboost.cache.mentored import MENTORED_SAMPLER, mentored_path

    spec = load_yaml("configs/default.yaml", RankConfig).cache_spec(1.0)
    names = {(d, b): mentored_path(spec, "ngram:3", d, b, 8).parent.name
             for d, b in (("kl", 0.05), ("tv", 0.2), ("hellinger", 1.0))}
    assert names == {("kl", 0.05): "mentored-051f416ef971a45b", ("tv", 0.2): "mentored-81b5d659151980fc",
                     ("hellinger", 1.0): "mentored-ef47a77b253cdb7e"}
    assert MENTORED_SAMPLER.startswith("mentored/v1:")
    assert mentored_path(spec, "ngram:3", "kl", 0.05, 8).parent.parent == spec.continuations_path(64).parent.parent
