"""Pool-cache orchestration: measured cost ratios reach the manifests without touching the pool."""

import json

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
        assert main[0] > 0 and "median" in main[1] and acc == main  # the acceptance folder built in the same call
        assert pc.cost_ratio(name) == main[0]
    assert pc.cost_ratio(spec.target) == 1.0 and pool.target.cost_method == "target (reference)"


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
