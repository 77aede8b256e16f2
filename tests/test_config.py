"""Strict config loader: defaults, nested overrides, unknown keys and type errors."""

import re
from dataclasses import dataclass, field
from typing import Literal

import pytest

from mdboost.cache.keys import fingerprint
from pipelines.loader import from_dict, load_yaml, to_dict
from pipelines.config import CacheConfig, MDConfig, RankConfig
from pipelines.validate_config import GenerationConfig, ValidateConfig


def test_empty_mapping_gives_defaults():
    assert from_dict(RankConfig, {}) == RankConfig()
    assert from_dict(RankConfig, None) == RankConfig()


def test_nested_override_keeps_other_defaults():
    cfg = from_dict(RankConfig, {"cache": {"k": 32}, "md": {"budgets": [0, 0.5]}})
    assert cfg.cache.k == 32 and cfg.cache.dtype == CacheConfig().dtype
    assert cfg.md.budgets == [0.0, 0.5] and all(isinstance(b, float) for b in cfg.md.budgets)
    assert cfg.pool == RankConfig().pool


def test_unknown_key_names_key_and_path():
    with pytest.raises(ValueError, match=r"unknown key 'budgts' at 'md'.*allowed keys: divergences, budgets"):
        from_dict(RankConfig, {"md": {"budgts": [0.1]}})
    with pytest.raises(ValueError, match=r"unknown key 'colour' at '<root>'"):
        from_dict(RankConfig, {"colour": 1})


@pytest.mark.parametrize("data, where", [
    ({"cache": {"k": "64"}}, "cache.k"),
    ({"cache": {"k": 1.5}}, "cache.k"),
    ({"cache": {"full_logits": 1}}, "cache.full_logits"),
    ({"cache": {"dtype": "float8"}}, "cache.dtype"),
    ({"md": {"budgets": [0.1, "x"]}}, r"md.budgets\[1\]"),
    ({"md": {"budgets": 0.1}}, "md.budgets"),
    ({"pool": {"device": 3}}, "pool.device"),
    ({"pool": "tiny"}, "pool"),
    ({"boosting": {"orders": ["target_first", "random"]}}, r"boosting.orders\[1\]"),
    ({"md": {"divergences": ["kl", "bogus"]}}, r"md.divergences\[1\]"),
    ({"speed": {"md_solve": "some"}}, "speed.md_solve"),
])
def test_type_errors_name_the_path(data, where):
    with pytest.raises(ValueError, match=f"config error at '{where}'"):
        from_dict(RankConfig, data)


def test_an_optional_field_of_the_wrong_type_names_its_path_once():
    with pytest.raises(ValueError) as err:
        from_dict(RankConfig, {"pool": {"device": 3}})
    # was "... got 3 (config error at 'pool.device': expected a string, got 3)"
    assert str(err.value) == "config error at 'pool.device': expected str | None, got 3 (expected a string, got 3)"


@pytest.mark.parametrize("data, what", [
    ({"md": {"divergences": ["kl", "bogus"]}}, "divergence"),
    ({"md": {"budgets": [-0.1]}}, "budgets"),
    ({"md": {"temperature": -0.5}}, "temperature"),
    ({"md": {"temperature": 0.0}, "cache": {"acceptance_source": "reference"}}, "acceptance_source"),
    ({"speed": {"gamma_min": 5, "gamma_max": 2}}, "gamma range"),
    ({"cache": {"k": 0}}, "k"),
    ({"cache": {"acceptance_max_new_tokens": 0}}, "acceptance_max_new_tokens"),
    ({"cache": {"acceptance_source": "teacher"}}, "acceptance_source"),
    ({"pool": {"drafters": []}}, "drafters"),
    ({"pool": {"drafters": ["int8", "int8"]}}, "drafters"),
])
def test_value_checks(data, what):
    with pytest.raises(ValueError, match=what):
        from_dict(RankConfig, data)


def test_optional_and_bool_accepted():
    cfg = from_dict(RankConfig, {"pool": {"device": None, "home": "/x"}, "tracking": {"enabled": False}})
    assert cfg.pool.device is None and cfg.pool.home == "/x" and cfg.tracking.enabled is False


def test_int_accepted_where_float_expected():
    assert from_dict(MDConfig, {"temperature": 1}).temperature == 1.0


def test_yaml_round_trip_and_fingerprint(tmp_path):
    import yaml

    cfg = from_dict(RankConfig, {"cache": {"k": 16}, "pool": {"target": "tiny", "drafters": ["ngram:2"]}})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    again = load_yaml(path, RankConfig)
    assert again == cfg
    assert fingerprint(again) == fingerprint(cfg)
    assert fingerprint(from_dict(RankConfig, {"cache": {"k": 17}})) != fingerprint(RankConfig())


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="config must be an existing YAML file"):
        load_yaml(tmp_path / "nope.yaml", RankConfig)


def test_generic_dataclass_support():
    @dataclass
    class Inner:
        x: int = 1

    @dataclass
    class Outer:
        inner: Inner = field(default_factory=Inner)
        table: dict[str, float] = field(default_factory=dict)
        pair: tuple[int, ...] = (1, 2)
        mode: Literal["a", "b"] = "a"

    out = from_dict(Outer, {"inner": {"x": 3}, "table": {"u": 1}, "pair": [4, 5, 6], "mode": "b"})
    assert out == Outer(Inner(3), {"u": 1.0}, (4, 5, 6), "b")
    with pytest.raises(ValueError, match=r"config error at 'table.u'"):
        from_dict(Outer, {"table": {"u": "no"}})
    with pytest.raises(ValueError, match=r"unknown key 'y' at 'inner'"):
        from_dict(Outer, {"inner": {"y": 1}})


@pytest.mark.parametrize("name", ["default", "full", "tiny"])
def test_shipped_configs_load(name):
    cfg = load_yaml(f"configs/{name}.yaml", RankConfig)
    assert cfg.name == name


def _plain(c):
    """A config as a dict without its name, output folder, pool device (int8 needs the CPU spelled
    out) and the spelling of ``md.temperatures`` (a list, or implied)."""
    d = to_dict(c)
    d["md"] = {k: v for k, v in d["md"].items() if k not in ("temperature", "temperatures")}
    d["md"]["sampling_temperatures"] = c.md.sampling_temperatures
    return {k: v for k, v in d.items() if k not in ("name", "output_dir")} | {"pool": d["pool"] | {"device": None}}


def test_the_full_grid_spells_out_the_library_defaults():
    assert _plain(load_yaml("configs/full.yaml", RankConfig)) == _plain(RankConfig())


def test_the_default_config_is_the_full_grid_but_for_a_first_runs_scope():
    """``configs/default.yaml`` (``make run``) differs from ``configs/full.yaml`` in the drafters,
    budgets, temperatures and batch sizes only (``docs/ranking.md``)."""
    default, full = (_plain(load_yaml(f"configs/{name}.yaml", RankConfig)) for name in ("default", "full"))
    differ = {(section, key) for section in full for key in (full[section] if isinstance(full[section], dict) else [])
              if default[section][key] != full[section][key]}
    assert differ == {("pool", "drafters"), ("md", "budgets"), ("md", "sampling_temperatures"), ("speed", "batch_sizes")}
    assert default["md"]["sampling_temperatures"] == [0.7] and default["speed"]["batch_sizes"] == [1]
    assert set(default["pool"]["drafters"]) < set(full["pool"]["drafters"])


@pytest.mark.parametrize("name", ["validate_default", "validate_tiny"])
def test_shipped_validate_configs_load(name):
    cfg = load_yaml(f"configs/{name}.yaml", ValidateConfig)
    assert cfg.ranking.cells >= 1 and cfg.generation.temperature is None  # sampling comes from the ranking
    with pytest.raises(ValueError, match=r"config error at 'generation.md_solve'"):
        from_dict(ValidateConfig, {"generation": {"md_solve": "sometimes"}})
    assert from_dict(GenerationConfig, {"md_solve": None}).md_solve is None


def test_wiring_hands_the_library_the_same_values():
    cfg = load_yaml("configs/tiny.yaml", RankConfig)
    text, spec, settings = cfg.data.text_source(), cfg.cache_spec(), cfg.score_settings()
    assert to_dict(cfg)["data"] == {k: getattr(text, k) for k in to_dict(cfg)["data"]}
    assert spec.text == text and spec.names == [cfg.pool.target, *cfg.pool.drafters]
    assert (spec.folders.k, spec.folders.full_logits, spec.acceptance_source) == (16, True, "reference")
    assert (spec.cost_repeats, spec.cost_context, spec.gamma_max) == (3, 16, 6)
    assert settings.divergences == ("kl", "tv") and settings.budgets == (0.0, 0.1, 0.5)
    assert (settings.gamma_min, settings.gamma_max, settings.md_solve, settings.n_estimators) == (1, 6, "needed", 2)
    assert settings.temperature == spec.temperature == 0.7  # the first of the default md.temperatures
    assert cfg.score_settings(1.0).temperature == cfg.cache_spec(1.0).temperature == 1.0
    assert settings.bootstrap.num_resamples == cfg.ranking.resamples == 1000


def test_sections_reach_the_library_by_name_from_one_section():
    """``library_settings`` takes each library field from the one section holding its name:
    a field held by none or by two is refused, not left at its default or taken at random."""
    import dataclasses

    from mdboost.cache.keys import FolderSettings, PoolCacheSpec
    from mdboost.data import TextSource
    from pipelines.config import CacheConfig, DataConfig, PoolConfig, SpeedConfig, library_settings

    assert isinstance(DataConfig(), TextSource) and DataConfig().text_source() == TextSource()
    assert [f.name for f in dataclasses.fields(DataConfig)] == [f.name for f in dataclasses.fields(TextSource)]
    assert library_settings(FolderSettings, CacheConfig(k=7, shard_size=3)) == FolderSettings(k=7, shard_size=3)
    with pytest.raises(TypeError, match=r"PoolCacheSpec.gamma_max is held by 0 of the sections"):
        library_settings(PoolCacheSpec, CacheConfig(), PoolConfig(target="tiny", drafters=["ngram:2"]),
                         text=TextSource(), folders=FolderSettings(), temperature=1.0)
    with pytest.raises(TypeError, match=r"FolderSettings.k is held by 2 of the sections"):
        library_settings(FolderSettings, CacheConfig(), CacheConfig())
    spec = library_settings(PoolCacheSpec, CacheConfig(), PoolConfig(target="tiny", drafters=["ngram:2"]),
                            SpeedConfig(gamma_max=5), text=TextSource(), folders=FolderSettings(), temperature=1.0)
    assert (spec.gamma_max, spec.drafters, spec.dir) == (5, ("ngram:2",), CacheConfig().dir)


def test_md_solve_defaults_to_the_engines():
    from mdboost.engine import GenerationSettings

    assert from_dict(RankConfig, {}).speed.md_solve == GenerationSettings().md_solve


def test_temperatures_list_or_scalar():
    assert from_dict(MDConfig, {}).sampling_temperatures == [0.7, 1.0]
    assert from_dict(MDConfig, {"temperature": 0.5}).sampling_temperatures == [0.5]
    assert from_dict(MDConfig, {"temperatures": [1.0, 0.6]}).sampling_temperatures == [1.0, 0.6]
    with pytest.raises(ValueError, match="temperature or temperatures, not both"):
        from_dict(MDConfig, {"temperature": 0.5, "temperatures": [1.0]})
    with pytest.raises(ValueError, match="temperatures"):
        from_dict(MDConfig, {"temperatures": [0.7, 0.7]})


@pytest.mark.parametrize("data, message", [
    ({"humaneval": {"timeout": 0}}, "invalid humaneval.timeout (seconds, > 0): 0.0"),
    ({"humaneval": {"tasks": -1}}, "invalid humaneval.tasks (>= 0; 0 turns HumanEval off): -1"),
    ({"humaneval": {"max_new_tokens": 0}}, "invalid humaneval.max_new_tokens (>= 1): 0"),
    ({"tolerance": -0.01}, "invalid tolerance (>= 0, the plot's band): -0.01"),
])
def test_validate_values_are_checked_when_loaded(data, message):
    """At load time, not after the generation grid ran (HumanEval is scored last)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        from_dict(ValidateConfig, data)
    assert from_dict(ValidateConfig, {"humaneval": {"tasks": 0}}).humaneval.tasks == 0  # 0 turns it off


@pytest.mark.parametrize("schema", [RankConfig, ValidateConfig])
def test_an_output_dir_that_is_a_file_is_a_config_error(tmp_path, schema):
    """Found when the config loads, naming output_dir (was: [Errno 20] Not a directory, after the whole run)."""
    afile = tmp_path / "ranking.txt"
    afile.write_text("")
    for out in (afile, afile / "sub"):
        with pytest.raises(ValueError, match=r"invalid output_dir \(a folder; .*ranking.txt' is a file\)"):
            from_dict(schema, {"output_dir": str(out)})
    assert from_dict(schema, {"output_dir": str(tmp_path / "new" / "folder")}).output_dir.endswith("folder")


@pytest.mark.parametrize("drafters, first, second, identity", [
    (["early_exit:2", "early_exit:02"], "early_exit:2", "early_exit:02", "early_exit:2"),
    (["ngram:2", "tuned:1", "ngram:002"], "ngram:2", "ngram:002", "ngram:2"),
    (["int8", "int8"], "int8", "int8", "int8"),
])
def test_specs_naming_one_drafter_are_refused_naming_both(drafters, first, second, identity):
    """Ranked twice before (early_exit:2 and early_exit:02 are one drafter)."""
    from pipelines.config import PoolConfig

    with pytest.raises(ValueError, match=rf"invalid drafters \(duplicates: '{first}' and '{second}' are the same "
                                         rf"drafter, {identity}\)"):
        PoolConfig(target="tiny", drafters=drafters)


def test_a_model_folder_named_by_two_paths_is_one_drafter(tmp_path, monkeypatch):
    from mdboost.models.specs import same_drafters

    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    assert same_drafters(["./m", str(tmp_path / "m"), "m2", "early_exit:1"]) == [("./m", str(tmp_path / "m"))]


def test_the_checks_run_last_read_at_their_sections_path():
    """The checks that load torch, transformers or mlflow run after every cheap check (a cheap
    mistake is reported first), their errors at the path the section's own checks would name."""
    off = {"tracking": {"enabled": False}}
    with pytest.raises(ValueError) as err:
        from_dict(RankConfig, {"md": {"rules": [{"rule": "mentored"}, {"rule": "rejection", "drafting": "sampled",
                                                                     "draft_p_min": 0.5}]}, **off})
    assert str(err.value).startswith("config error at 'md.rules[1]': draft_p_min=0.5 needs drafting='greedy'")
    with pytest.raises(ValueError, match=r"^config error at 'md': invalid rules \(duplicates\)"):
        from_dict(RankConfig, {"md": {"rules": [{"rule": "match"}, {"rule": "match", "drafting": "greedy"}]}, **off})
    with pytest.raises(ValueError, match=r"^config error at 'pool': invalid drafters\[1\]: .*'early_exit:99'"):
        from_dict(RankConfig, {"pool": {"target": "tiny", "drafters": ["ngram:2", "early_exit:99"]}, **off})
    with pytest.raises(ValueError, match=r"^config error at 'tracking': invalid tracking.tracking_uri: .*bogus://x"):
        from_dict(ValidateConfig, {"tracking": {"tracking_uri": "bogus://x"}})
    with pytest.raises(ValueError, match=r"^config error at 'md': invalid budgets"):
        from_dict(RankConfig, {"pool": {"target": "tiny", "drafters": ["early_exit:99"]}, "md": {"budgets": [-1]},
                               "tracking": {"tracking_uri": "bogus://x"}})
