"""Cache folder keys are a compatibility contract: the names below were computed by the code that
built users' caches (``mdboost/ranking/from_cache.py`` before the cache keys moved to
``mdboost/cache/keys.py``); a change here means every existing cache gets rebuilt. They moved
since: the ``int8`` folders twice (their rows were computed as the engine drafts, then the
drafter quantized each token's activations alone: ``mdboost.models.pool.ROW_REVISIONS``), and
every folder once when ``data.limit`` became a seeded sample (``TextSource.sample`` and
``stratify`` joined the keyed fields, and the default ranking's prompts changed)."""

import dataclasses

import pytest

from mdboost.cache.keys import SAMPLER, fingerprint
from pipelines.loader import load_yaml
from pipelines.config import RankConfig

PINNED = {
    "tiny": {
        "main": {
            "tiny": "tiny-a2e639a01254c6ac",
            "early_exit:2": "early_exit_2-d803389e5cb43d33",
            "tuned:2": "tuned_2-313baa0628f8e743",
            "int8": "int8-847f64971f257dc4",
            "ngram:2": "ngram_2-49524bbaa8e042b6",
        },
        "acceptance": {
            "tiny": "tiny-e511b1f2f3b56163",
            "early_exit:2": "early_exit_2-83ba42a0204ffb3b",
            "tuned:2": "tuned_2-e3ad1c6616ca343b",
            "int8": "int8-b0cc1124a13bc535",
            "ngram:2": "ngram_2-65a9f66f10368fb4",
        },
        "continuations": {
            "16": "continuations-633570a34c4ed5be",
            "128": "continuations-d4688465b9f8552b",
        },
        "fingerprint": "1fdae09759cfdd63",
    },
    "full": {
        "main": {
            "smollm2-135m": "smollm2-135m-7877f94ba0a12ccb",
            "early_exit:12": "early_exit_12-edde6c4d0f079404",
            "early_exit:18": "early_exit_18-621621bbb4986b9a",
            "early_exit:24": "early_exit_24-011e13de56cad9b4",
            "early_exit:27": "early_exit_27-30076b27421428ac",
            "tuned:12": "tuned_12-edb5255e5873c255",
            "tuned:18": "tuned_18-b739f061897148eb",
            "tuned:24": "tuned_24-104f664746655148",
            "tuned:27": "tuned_27-d74277fec3174b5f",
            "int8": "int8-f986575b0072a8c1",
            "ngram:3": "ngram_3-7c0a198c53c6d0d3",
        },
        "acceptance": {
            "smollm2-135m": "smollm2-135m-12c17642461a8dc3",
            "early_exit:12": "early_exit_12-956f82cfc130e315",
            "early_exit:18": "early_exit_18-e743015b1b79d82c",
            "early_exit:24": "early_exit_24-440c9a5754ff06a6",
            "early_exit:27": "early_exit_27-eb9db9a8ce6595db",
            "tuned:12": "tuned_12-8559d8013ea77fce",
            "tuned:18": "tuned_18-b7d3a4a34eb2f332",
            "tuned:24": "tuned_24-7bcdfd0fa6b9fd30",
            "tuned:27": "tuned_27-e0a85cf8eb7327b7",
            "int8": "int8-5b640ec784d6fe16",
            "ngram:3": "ngram_3-7f288655b356188d",
        },
        "continuations": {
            "64": "continuations-c545a7a3a478b5f7",
            "128": "continuations-1d1ea7e00e00bf8c",
        },
        "fingerprint": "fb6953c766584101",
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
    cfg = load_yaml("configs/full.yaml", RankConfig)
    assert cfg.md.sampling_temperatures == [0.7, 1.0]
    cold, warm = cfg.cache_spec(0.7), cfg.cache_spec(1.0)
    assert all(cold.member_dir(m) != warm.member_dir(m) for m in cold.names)
    assert {m: warm.member_dir(m).name for m in warm.names} == PINNED["full"]["main"]


def test_the_default_config_shares_the_full_grids_folders():
    """``configs/default.yaml`` ranks part of ``configs/full.yaml``'s grid: its members' folders,
    continuations and speed file are the full grid's, so either run reuses what the other built."""
    from mdboost.cache.speed import speed_path

    default, full = (load_yaml(f"configs/{name}.yaml", RankConfig) for name in ("default", "full"))
    assert default.md.sampling_temperatures == [0.7] and set(default.pool.drafters) < set(full.pool.drafters)
    small, big = default.cache_spec(0.7), full.cache_spec(0.7)
    for acceptance in (False, True):
        assert all(small.member_dir(m, acceptance) == big.member_dir(m, acceptance) for m in small.names)
    assert small.continuations_path(64) == big.continuations_path(64) and speed_path(small) == speed_path(big)


def test_mentored_continuations_keep_their_names():
    """The mentored rows files of the default pool (prompt lookup's budget points, T = 1), and the
    sampler version they are keyed on."""
    from mdboost.cache.mentored import MENTORED_SAMPLER, mentored_path

    spec = load_yaml("configs/full.yaml", RankConfig).cache_spec(1.0)
    names = {(d, b): mentored_path(spec, "ngram:3", d, b, 8).parent.name
             for d, b in (("kl", 0.05), ("tv", 0.2), ("hellinger", 1.0))}
    assert names == {("kl", 0.05): "mentored-add4dc9bdd89633c", ("tv", 0.2): "mentored-97b6da484b23138f",
                     ("hellinger", 1.0): "mentored-6c17dd5dd8a204fa"}
    assert MENTORED_SAMPLER.startswith("mentored/v1:")
    assert mentored_path(spec, "ngram:3", "kl", 0.05, 8).parent.parent == spec.continuations_path(64).parent.parent
