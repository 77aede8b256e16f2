"""Pool-cache orchestration: measured cost ratios (median, method, repeat samples) reach the manifests
without touching the pool."""

import json
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


def test_costs_go_to_the_manifests_not_the_pool(built):
    cfg, pc, info, pools = built
    spec = cfg.cache_spec()
    assert len(pools) == 1 and sorted(info.built) == sorted(spec.names) and not info.reused
    pool = pools[0]
    for name in cfg.pool.drafters:
        assert pool[name].cost_ratio is None and pool[name].cost_method == "not measured"
        main = json.loads((spec.member_dir(name) / "manifest.json").read_text())["member_costs"][name]
        acc = json.loads((spec.member_dir(name, acceptance=True) / "manifest.json").read_text())["member_costs"][name]
        assert acc == main  # the acceptance folder built in the same call
        ratio, method, samples = main
        assert len(samples) == spec.cost_repeats and ratio == statistics.median(samples) > 0
        assert "engine steps" in method and "1 threads" in method and "load" in method
        assert pc.cost_ratio(name) == ratio and pc.cost_samples(name) == samples
    assert pc.cost_ratio(spec.target) == 1.0 and pool.target.cost_method == "target (reference)"
    assert pc.cost_samples(spec.target) is None


def test_manifests_without_samples_still_read(built):
    """A folder measured before the samples were kept (``[ratio, method]``) keeps its ratio, no samples."""
    from mdboost.cache.reader import LogitCache

    cfg, pc, _, _ = built
    name = cfg.pool.drafters[0]
    old = LogitCache.open(cfg.cache_spec().member_dir(name))
    old.manifest["member_costs"][name] = [0.42, "median of 21 alternating single-token decode steps"]
    assert old.cost_ratio(name) == 0.42 and old.cost_samples(name) is None


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
    monkeypatch.setattr(pool_cache, "measure_member_cost", lambda *a, **k: calls.append(a) or (9.0, "x", [9.0]))
    other = cfg.cache_spec(0.5)
    assert other.member_dir("early_exit:2") != cfg.cache_spec().member_dir("early_exit:2")
    pc2, info = open_or_build_cache(other, known_costs=pc.cost_entries())
    assert calls == [] and sorted(info.built) == sorted(other.names)
    assert pc2.cost_entries() == pc.cost_entries()
    assert {n: pc2.cost_samples(n) for n in cfg.pool.drafters} == {n: pc.cost_samples(n) for n in cfg.pool.drafters}
