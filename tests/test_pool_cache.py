"""Pool-cache orchestration: measured costs (median, method, repeat samples, the target's profile)
reach the pool's speed file without touching the pool or the logit folders."""

import statistics

import pytest

from tests.test_rank_pipeline import _config as rank_config


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import mdboost.models.pool as models_pool
    from mdboost.cache import open_or_build_cache

    tmp_path = tmp_path_factory.mktemp("pool_cache")
    cfg = rank_config(tmp_path, pool={"pairs": "target", "drafters": ["early_exit:2", "ngram:2"]}, data={"limit": 2},
                      cache={"acceptance_source": "sampled", "acceptance_max_new_tokens": 4})
    pools = []
    real = models_pool.build_pool
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(models_pool, "build_pool", lambda *a, **k: pools.append(real(*a, **k)) or pools[-1])
        pc, info = open_or_build_cache(cfg.cache_spec())
    return cfg, pc, info, pools


def test_costs_go_to_the_speed_file_not_the_pool(built):
    from mdboost.cache.speed import SpeedStore, speed_path
    from mdboost.engine.costs import COST_UNIT

    cfg, pc, info, pools = built
    spec = cfg.cache_spec()
    assert len(pools) == 1 and sorted(info.built) == sorted(spec.names) and not info.reused
    assert info.measured_speed_profile and sorted(info.measured_costs) == sorted(cfg.pool.drafters)
    pool, store = pools[0], SpeedStore(speed_path(spec))
    assert pc.speed.path == store.path and store.path.parent == spec.member_dir(spec.target).parent
    for name in cfg.pool.drafters:
        assert pool[name].cost_ratio is None and pool[name].cost_method == "not measured"
        entry = store.drafter(name)
        assert len(entry["samples"]) == spec.cost_repeats and entry["median"] == statistics.median(entry["samples"]) > 0
        assert "engine steps" in entry["method"] and "1 threads" in entry["method"] and "load" in entry["method"]
        assert pc.cost_ratio(name) == entry["median"] and pc.cost_samples(name) == entry["samples"]
        assert pc.prefill_per_token(name) == entry["prefill_per_token"]
        # prompt lookup has no model to feed the prompt through (model drafters' slopes are timed:
        # tests/test_engine_costs.py checks them against known forward times)
        if name == "ngram:2":
            assert entry["prefill_per_token"] == 0
    assert pc.cost_ratio(spec.target) == 1.0 and pool.target.cost_method == "target (reference)"
    assert pc.cost_samples(spec.target) is None
    profile = pc.speed_profile_info(spec.target)
    assert profile == store.profile and profile["unit"] == COST_UNIT and profile["verify_cost"][0] == 1.0
    assert len(profile["verify_cost"]) == max(spec.gamma_max, 8) + 1 and profile["prefill_per_token"] > 0
    assert pc.prefill_per_token(spec.target) == profile["prefill_per_token"]
    assert pc.speed_profile_info("early_exit:2") is None


def test_reopen_loads_no_model(built):
    import mdboost.models.pool as models_pool
    from mdboost.cache import open_or_build_cache

    cfg, pc, _, _ = built
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(models_pool, "build_pool", lambda *a, **k: pytest.fail("a complete cache loads no model"))
        again, info = open_or_build_cache(cfg.cache_spec())
    assert info.reused and not info.measured_speed_profile and info.built == info.built_acceptance == ()
    assert again.names == pc.names and again.acceptance.names == pc.acceptance.names
    assert again.speed_profile_info(cfg.pool.target) == pc.speed_profile_info(cfg.pool.target)


def test_another_temperature_reuses_the_measured_costs(built, monkeypatch):
    """The rank pipeline builds each temperature's folders; costs (temperature-free) are measured once."""
    import mdboost.cache.pool_cache as pool_cache
    from mdboost.cache import open_or_build_cache

    cfg, pc, _, _ = built
    calls = []
    monkeypatch.setattr(pool_cache, "member_cost_repeats", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(pool_cache, "speed_profile_repeats", lambda *a, **k: calls.append(a))
    other = cfg.cache_spec(0.5)
    assert other.member_dir("early_exit:2") != cfg.cache_spec().member_dir("early_exit:2")
    pc2, info = open_or_build_cache(other)
    assert calls == [] and sorted(info.built) == sorted(other.names) and not info.measured_speed_profile
    assert info.measured_costs == ()
    assert pc2.speed.path == pc.speed.path
    assert {n: pc2.cost_samples(n) for n in cfg.pool.drafters} == {n: pc.cost_samples(n) for n in cfg.pool.drafters}

@pytest.mark.parametrize("text", [b"[]", b"\xff\xfe garbage", b'{"format": "mdboost-speed/1", "profile": null, "drafters": []}'])
def test_a_damaged_speed_file_says_to_delete_it(tmp_path, text):
    from mdboost.cache.speed import SpeedStore

    path = tmp_path / "speed-x.json"
    path.write_bytes(text)  # were AttributeError "'list' object has no attribute 'get'" and UnicodeDecodeError
    with pytest.raises(ValueError, match=r"^speed file .* delete it to measure again$"):
        SpeedStore(path).missing(["ngram:2"])
