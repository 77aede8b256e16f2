"""Cost profiles (``mdboost.cache.profile``): the file, its checks, and ``mdboost rank --costs``.

The tiny pool is ranked once with this machine's costs (module fixture); its profile written by
``mdboost profile`` must give the same ``ranking.csv`` bytes when re-scored with ``--costs``, and
a profile with one drafter's ``c`` doubled must change that drafter's predicted speedups only.
"""

import json
import math
from pathlib import Path

import pytest
import yaml

from mdboost import cli
from mdboost.cache.keys import PoolCacheSpec
from mdboost.cache.profile import (CPU_FLAGS, check_profile, costs_line, hardware_fingerprint, pool_identity,
                                   read_profile, write_profile)
from mdboost.cache.speed import FORMAT, KEY_FORMAT, SpeedStore
from mdboost.data import TextSource
from mdboost.engine.costs import COST_UNIT
from mdboost.ranking.report import read_csv
from pipelines.config import RankConfig
from pipelines.loader import from_dict, load_yaml, to_dict

ENTRY = {"median": 0.5, "samples": [0.4, 0.5, 0.6], "prefill_per_token": 0.01, "method": "m", "threads": 1,
         "load_before": 0.1, "load_after": 0.2}
PROFILE = {"unit": COST_UNIT, "verify_cost": [1.0] + [1.1] * 8, "verify_samples": [[1.0]] * 9,
           "md_overhead": {"dense": 0.01, "onehot": 0.0}, "prefill_per_token": 0.002, "step_seconds": 0.01,
           "method": "m", "threads": 1, "load_before": 0.1, "load_after": 0.2}


def _spec(tmp_path, target="tiny", temperature=1.0) -> PoolCacheSpec:
    return PoolCacheSpec(str(tmp_path), TextSource(), target, ("early_exit:2", "ngram:2"), temperature=temperature)


def _store(tmp_path, spec, vocabulary="vocab-a", drafters=("early_exit:2", "ngram:2")) -> SpeedStore:
    store = SpeedStore(tmp_path / "speed-x.json")
    store.identify(pool_identity(spec, vocabulary), hardware_fingerprint("cpu"))
    store.set_profile(PROFILE)
    for name in drafters:
        store.set_drafter(name, dict(ENTRY))
    return store


def test_a_profile_round_trips(tmp_path):
    spec = _spec(tmp_path)
    store = _store(tmp_path, spec, drafters=("early_exit:2", "ngram:2", "int8"))
    path = write_profile(store, tmp_path / "p.json", spec.drafters)
    back = read_profile(path)
    assert back.to_dict() == store.to_dict(spec.drafters) and back.kind == "cost profile"
    assert set(back.to_dict()["drafters"]) == {"early_exit:2", "ngram:2"}  # only the pool's drafters
    assert back.to_dict()["format"] == FORMAT and back.engine == "mdboost"
    check_profile(back, spec, "vocab-a", gamma_max=8)  # its own pool: accepted


def test_the_hardware_fingerprint_of_this_machine():
    hw = hardware_fingerprint("cpu")
    assert set(hw) == {"cpu", "cpu_flags", "cpu_count", "machine", "cuda", "torch_threads", "torch", "dtype",
                       "cpu_capability", "kernel_env", "load_average"}
    assert hw["cuda"] is None and hw["dtype"] == "float32" and hw["torch_threads"] == 1
    assert isinstance(hw["torch"], str) and "+" not in hw["torch"]
    assert set(hw["cpu_flags"]) <= set(CPU_FLAGS)
    if Path("/proc/cpuinfo").is_file():
        text = Path("/proc/cpuinfo").read_text()
        lines = [line for line in text.splitlines() if line.split(":")[0].strip() == "flags"]  # none on ARM
        flags = lines[0].split(":", 1)[1].split() if lines else []
        assert hw["cpu_flags"] == [f for f in CPU_FLAGS if f in flags]
        if "model name" in text:
            assert isinstance(hw["cpu"], str) and hw["cpu"] in text
    assert hw["load_average"] is None or (len(hw["load_average"]) == 3 and all(x >= 0 for x in hw["load_average"]))
    assert json.loads(json.dumps(hw)) == hw
    assert hw["cpu"] in costs_line(hw)


REFUSED = {
    "another target": (dict(target="tiny:3"), {}, r"another target: 'tiny', the pool's is 'tiny:3'"),
    "another vocabulary": ({}, dict(vocabulary="vocab-b"), r"another vocabulary: 'vocab-a', the pool's is 'vocab-b'"),
    "greedy for sampled": (dict(temperature=0.0), {}, r"another decoding .*'sampled', the pool's is 'greedy'"),
    "a missing drafter": ({}, dict(drafters=("early_exit:2",)), r"lacks drafter\(s\) \['ngram:2'\]"),
    "a short v(K)": ({}, dict(gamma_max=9), r"v\(K\) for K <= 8, the ranking's gamma_max is 9"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_a_profile_of_another_pool_is_refused(tmp_path, case):
    other_spec, other, message = REFUSED[case]
    store = _store(tmp_path, _spec(tmp_path), drafters=other.get("drafters", ("early_exit:2", "ngram:2")))
    path = write_profile(store, tmp_path / "p.json", store.to_dict()["drafters"])
    spec = _spec(tmp_path, **other_spec)
    with pytest.raises(ValueError, match=rf"^cost profile {str(path)!r} .*{message}"):
        check_profile(read_profile(path), spec, other.get("vocabulary", "vocab-a"), other.get("gamma_max", 8))


def test_a_profile_of_another_unit_or_without_a_pool_is_refused(tmp_path):
    spec = _spec(tmp_path)
    store = _store(tmp_path, spec)
    store.set_profile(dict(PROFILE, unit="engine-step-wall-v0"))
    with pytest.raises(ValueError, match=r"measured in unit 'engine-step-wall-v0'"):
        check_profile(read_profile(write_profile(store, tmp_path / "p.json", spec.drafters)), spec, "vocab-a", 8)
    old = tmp_path / "old.json"  # a format-1 speed file: read, but it names no pool
    old.write_text(json.dumps({"format": KEY_FORMAT, "profile": PROFILE, "drafters": {"ngram:2": ENTRY}}))
    assert SpeedStore(old).hardware is None and SpeedStore(old).to_dict()["format"] == FORMAT
    with pytest.raises(ValueError, match=r"names no pool or hardware \(a speed file of format 1\)"):
        check_profile(read_profile(old), spec, "vocab-a", 8)


def _config(tmp_path, out: str = "out") -> RankConfig:
    data = to_dict(load_yaml("configs/tiny.yaml", RankConfig))
    data["pool"]["drafters"] = ["early_exit:2", "ngram:2"]
    data["data"]["limit"] = 3
    data["md"].update(budgets=[0.0, 0.3], temperatures=[0.0, 1.0], rules=[{"rule": "mentored", "drafting": "sampled"}])
    data["ranking"]["frontier_rows"] = 4
    data["cache"]["acceptance_source"] = "sampled"  # greedy rows need it; the mentored text is read back too
    data["cache"]["dir"] = str(tmp_path / "cache")
    data["output_dir"] = str(tmp_path / out)
    data["tracking"]["enabled"] = False
    return from_dict(RankConfig, data)


def _write(cfg: RankConfig, path: Path) -> Path:
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    return path


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    """The tiny pool ranked with this machine's costs, and its profiles (sampled, greedy) written."""
    from pipelines.rank_pool import run

    tmp = tmp_path_factory.mktemp("profiles")
    cfg = _config(tmp)
    summary = run(cfg)
    assert cli.main(["profile", "--config", str(_write(cfg, tmp / "c.yaml")), "--out", str(tmp / "p.json")]) == 0
    return tmp, cfg, summary


def test_rescoring_with_the_own_profile_gives_the_same_csv(ranked, monkeypatch):
    import mdboost.models.pool

    tmp, cfg, summary = ranked
    profiles = [tmp / "p.json", tmp / "p-greedy.json"]
    assert [read_profile(p).pool["sampling"] for p in profiles] == ["sampled", "greedy"]

    def no_model(*args, **kwargs):
        raise AssertionError("re-scoring loaded a model")

    monkeypatch.setattr(mdboost.models.pool, "build_pool", no_model)
    out = tmp / "rescored"
    argv = ["rank", "--config", str(_write(cfg, tmp / "c.yaml")), "--set", f"output_dir={out}"]
    assert cli.main(argv + ["--costs", str(profiles[1]), "--costs", str(profiles[0])]) == 0
    assert (out / "ranking.csv").read_bytes() == (tmp / "out" / "ranking.csv").read_bytes()
    again = json.loads((out / "summary.json").read_text())
    assert summary["cost_profile"] is None and again["cost_profile"] == [str(profiles[1]), str(profiles[0])]
    assert again["hardware"] == read_profile(profiles[0]).hardware == summary["hardware"]
    assert again["hardware"]["cpu"] in again["verdict"] and str(profiles[0]) in again["verdict"]
    assert again["recommendation_markdown"].splitlines()[0] == f"**{again['verdict']}**"
    assert not again["measured_speed_profile"] and again["cache_reused"]


def test_kept_work_prices_to_what_a_fresh_scoring_computes(ranked, tmp_path, monkeypatch):
    """The fixture's run kept its cost-free work (``scores/``); a run that reads it computes no pair
    work and no frontier, and gives the bytes of a run on a copy of the cache without it."""
    import shutil

    import mdboost.ranking.scaleout
    import pipelines.rank_pool
    from pipelines.rank_pool import run

    tmp, cfg, _ = ranked
    assert any((tmp / "cache" / "scores").glob("pair-*.pt")) and any((tmp / "cache" / "scores").glob("frontier-*.pt"))

    def computed(*args, **kwargs):
        raise AssertionError("kept work computed again")

    with monkeypatch.context() as m:
        m.setattr(mdboost.ranking.scaleout, "pair_work", computed)
        m.setattr(pipelines.rank_pool, "frontier", computed)
        run(from_dict(RankConfig, to_dict(cfg) | {"output_dir": str(tmp_path / "kept")}))
    shutil.copytree(tmp / "cache", tmp_path / "cache", ignore=shutil.ignore_patterns("scores", ".*.lock"))
    data = to_dict(cfg) | {"output_dir": str(tmp_path / "fresh")}
    data["cache"]["dir"] = str(tmp_path / "cache")
    run(from_dict(RankConfig, data))
    assert any((tmp_path / "cache" / "scores").iterdir())
    for name in ("ranking.csv", "frontier.csv"):
        assert (tmp_path / "kept" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes()


def _key(row: dict) -> tuple:
    return tuple(row[c] for c in ("drafter", "target", "temperature", "divergence", "max_divergence", "gamma", "rule",
                                  "drafting", "draft_p_min", "batch_size"))


def test_a_doubled_drafter_cost_changes_its_rows_only(ranked):
    tmp, cfg, _ = ranked
    data = json.loads((tmp / "p.json").read_text())
    entry = data["drafters"]["early_exit:2"]
    entry["median"], entry["samples"] = 2 * entry["median"], [2 * x for x in entry["samples"]]
    (tmp / "slow.json").write_text(json.dumps(data))
    from pipelines.rank_pool import run

    run(_config(tmp, "slow"), costs=[tmp / "slow.json", tmp / "p-greedy.json"])
    before = {_key(r): r for r in read_csv(tmp / "out" / "ranking.csv")}
    after = {_key(r): r for r in read_csv(tmp / "slow" / "ranking.csv")}
    assert before.keys() == after.keys()
    for key, row in after.items():
        old, new = float(before[key]["predicted_speedup"]), float(row["predicted_speedup"])
        if key[0] == "early_exit:2" and float(key[2]) == 1.0 and key[-1] == "1":  # the batch-1 entry was doubled
            assert new < old and math.isclose(float(row["cost_ratio"]), 2 * float(before[key]["cost_ratio"]))
        else:
            assert new == old


def test_a_drafter_cost_factor_moves_the_speedup_along_the_break_even_line(ranked):
    """Tripling a drafter's costs (c, its samples and its prefill) gives, on every one of its rows,
    ``1/s = 1/s0 + 3 (1/s1 - 1/s0)`` from the first ranking's ``predicted_speedup`` (s1) and
    ``speedup_free_drafter`` (s0): the linearity the break-even costs rest on."""
    from mdboost.ranking.breakeven import break_even_cost
    from pipelines.rank_pool import run

    tmp, cfg, summary = ranked
    data = json.loads((tmp / "p.json").read_text())
    entry = data["drafters"]["early_exit:2"]
    entry["median"], entry["samples"] = 3 * entry["median"], [3 * x for x in entry["samples"]]
    entry["prefill_per_token"] = 3 * entry["prefill_per_token"]
    (tmp / "triple.json").write_text(json.dumps(data))
    run(_config(tmp, "triple"), costs=[tmp / "triple.json", tmp / "p-greedy.json"])
    before = {_key(r): r for r in read_csv(tmp / "out" / "ranking.csv")}
    checked = 0
    for key, row in ((k, r) for k, r in ((_key(r), r) for r in read_csv(tmp / "triple" / "ranking.csv"))
                     if k[0] == "early_exit:2" and float(k[2]) == 1.0 and k[-1] == "1" and r["rule"] != "alone"):
        s1, s0 = float(before[key]["predicted_speedup"]), float(before[key]["speedup_free_drafter"])
        assert 1 / float(row["predicted_speedup"]) == pytest.approx(1 / s0 + 3 * (1 / s1 - 1 / s0), rel=1e-9)
        c = float(before[key]["cost_ratio"])
        at = break_even_cost(s1, s0, c, float(row["predicted_speedup"]))  # the cost that gives the new speedup
        assert at == pytest.approx(3 * c, rel=1e-9) or s0 == pytest.approx(s1, rel=1e-12)
        checked += 1
    assert checked > 0
    costs = summary["break_even_costs"]
    assert set(costs) == {"early_exit:2", "ngram:2"} and summary["hardware_dependence"] in summary["verdict"]


def test_rescoring_without_a_cache_says_to_rank_first(ranked, tmp_path, capsys):
    tmp, cfg, _ = ranked
    config = _write(_config(tmp_path), tmp_path / "c.yaml")  # an empty cache folder
    assert cli.main(["rank", "--config", str(config), "--costs", str(tmp / "p.json"),
                     "--costs", str(tmp / "p-greedy.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "run `mdboost rank` on this config first" in err
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("content", [None, b"{not json", b"[]"], ids=["missing", "garbled", "not an object"])
def test_a_missing_or_garbled_profile_exits_2(tmp_path, capsys, content):
    config = _write(_config(tmp_path), tmp_path / "c.yaml")
    path = tmp_path / "p.json"
    if content is not None:
        path.write_bytes(content)
    assert cli.main(["rank", "--config", str(config), "--costs", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"mdboost rank: error: cost profile {str(path)!r}") and "\n" not in err
    assert ("does not exist" if content is None else "write it again with `mdboost profile`") in err


def test_profile_measures_on_a_fresh_folder_without_building_caches(tmp_path, capsys):
    cfg = _config(tmp_path)
    data = to_dict(cfg)
    data["md"]["temperatures"] = [1.0]
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(data))
    assert cli.main(["profile", "--config", str(config), "--out", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "measured target profile, early_exit:2, ngram:2" in out and "cost profile:" in out
    names = [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]  # no logit cache
    assert len(names) == 1 and names[0].startswith("speed-") and names[0].endswith(".json")
    profile = read_profile(tmp_path / "p.json")
    assert profile.pool["target"] == "tiny" and profile.pool["sampling"] == "sampled"
    assert profile.hardware["load_average"] is None or len(profile.hardware["load_average"]) == 3
    assert profile.missing(["early_exit:2", "ngram:2"]) == [] and len(profile.profile["verify_cost"]) == 9


def test_kernels_capped_below_the_cpu_are_another_machine(tmp_path, monkeypatch):
    """A kernel cap (ATEN_CPU_CAPABILITY, ...) keys its own speed file and is named in the fingerprint."""
    from mdboost.cache.profile import hardware_label
    from mdboost.cache.speed import speed_path

    spec = _spec(tmp_path)
    for name in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    native, hw = speed_path(spec), hardware_fingerprint("cpu")
    assert hw["kernel_env"] == {} and "capped" not in hardware_label(hw)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    capped = hardware_fingerprint("cpu")
    assert speed_path(spec) != native and capped["kernel_env"] == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    assert "kernels capped: MKL_ENABLE_INSTRUCTIONS=AVX2" in hardware_label(capped)


def test_a_profile_without_a_ranked_batch_size_is_refused(tmp_path):
    spec = PoolCacheSpec(str(tmp_path), TextSource(), "tiny", ("early_exit:2", "ngram:2"), batch_sizes=(1, 4))
    store = _store(tmp_path, spec)
    with pytest.raises(ValueError, match="no target profile .* at batch size 4"):
        check_profile(store, spec, "vocab-a", 8)
    store.set_profile(PROFILE, 4)
    store.set_drafter("early_exit:2", ENTRY, 4)
    with pytest.raises(ValueError, match=r"lacks drafter\(s\) \['ngram:2'\] of the pool at batch size 4"):
        check_profile(store, spec, "vocab-a", 8)
    store.set_drafter("ngram:2", ENTRY, 4)
    check_profile(store, spec, "vocab-a", 8)
    assert store.batch_sizes == [1, 4] and SpeedStore(store.path).drafter("ngram:2", 4) == ENTRY
