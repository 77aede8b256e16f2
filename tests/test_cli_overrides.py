"""``--set key.path=value``: parsed as YAML, applied before the strict loader checks the config,
unknown keys and wrong types named; paths relative to the working directory; a missing
ranking says which command makes it."""

import shutil
from pathlib import Path

import pytest
import yaml

from mdboost import cli
from pipelines.config import RankConfig
from pipelines.validate_config import ValidateConfig
from pipelines.loader import apply_overrides, load_yaml, parse_override

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, keys, value", [
    ("md.budgets=[0,0.1]", ["md", "budgets"], [0, 0.1]),
    ("output_dir=out/x", ["output_dir"], "out/x"),
    ("tracking.enabled=false", ["tracking", "enabled"], False),
    ("generation.temperature=null", ["generation", "temperature"], None),
    ("name=a=b", ["name"], "a=b"),  # the first '=' splits
    ("data.limit= 3", ["data", "limit"], 3),
])
def test_parse_override_reads_the_value_as_yaml(text, keys, value):
    assert parse_override(text) == (keys, value)


@pytest.mark.parametrize("text", ["md.budgets", "=3", "md..budgets=1", ".x=1", "md.=1"])
def test_parse_override_refuses_a_malformed_override_naming_it(text):
    with pytest.raises(ValueError, match="key.path=value") as err:
        parse_override(text)
    assert repr(text) in str(err.value)


def test_an_override_through_a_value_is_refused():
    with pytest.raises(ValueError, match="'md.budgets' holds"):
        apply_overrides({"md": {"budgets": [0.0]}}, ["md.budgets.x=1"])


def test_overrides_apply_in_order_and_leave_the_input_alone():
    data = {"md": {"budgets": [0.0]}}
    out = apply_overrides(data, ["md.budgets=[1]", "md.budgets=[2]", "pool.pairs=all"])
    assert out == {"md": {"budgets": [2]}, "pool": {"pairs": "all"}}
    assert data == {"md": {"budgets": [0.0]}}


def test_load_yaml_applies_overrides_then_validates():
    cfg = load_yaml(REPO / "configs/tiny.yaml", RankConfig,
                    ["md.budgets=[0,0.1]", "output_dir=out/x", "tracking.enabled=false"])
    plain = load_yaml(REPO / "configs/tiny.yaml", RankConfig)
    assert cfg.md.budgets == [0.0, 0.1] and plain.md.budgets == [0.0, 0.1, 0.5]
    assert cfg.output_dir == "out/x" and cfg.tracking.enabled is False
    assert cfg.pool == plain.pool and cfg.cache == plain.cache  # the rest as in the file


def _capture_run(monkeypatch, module):
    seen = {}

    def fake_run(cfg, *args):
        seen["cfg"] = cfg
        raise SystemExit(0)

    monkeypatch.setattr(module, "run", fake_run)
    monkeypatch.setattr(module, "quiet_libraries", lambda: seen.setdefault("quiet", True), raising=False)
    return seen


def test_rank_set_reaches_the_pipeline(monkeypatch):
    import pipelines.rank_pool as rank_pool

    seen = _capture_run(monkeypatch, rank_pool)
    with pytest.raises(SystemExit):
        cli.main(["rank", "--config", str(REPO / "configs/tiny.yaml"), "--set", "md.budgets=[0,0.1]",
                  "--set", "output_dir=out/x", "--set", "pool.drafters=[ngram:2]"])
    cfg = seen["cfg"]
    assert cfg.md.budgets == [0.0, 0.1] and cfg.output_dir == "out/x" and cfg.pool.drafters == ["ngram:2"]


@pytest.mark.parametrize("override, named", [
    ("md.budgts=[0]", "unknown key 'budgts' at 'md'"),
    ("nosuchsection.x=1", "unknown key 'nosuchsection' at '<root>'"),
    ("md.budgets=abc", "'md.budgets': expected a list"),
    ("cache.k=-1", "invalid k (>= 1): -1"),
    ("pool.drafters=[early_exit:99]", "early_exit:99"),
])
def test_a_bad_override_is_one_line_naming_the_key(monkeypatch, capsys, override, named):
    import pipelines.rank_pool as rank_pool

    monkeypatch.setattr(rank_pool, "run", lambda cfg, costs=None: pytest.fail("a bad override must not start the pipeline"))
    assert cli.main(["rank", "--config", str(REPO / "configs/tiny.yaml"), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err, err


def test_validate_takes_set_too(monkeypatch, capsys, tmp_path):
    import pipelines.validate_pairs as validate_pairs

    seen = {}

    def fake_plan(cfg):
        seen["cfg"] = cfg
        raise ValueError("stopped after the config")

    monkeypatch.setattr(validate_pairs, "plan", fake_plan)
    assert cli.main(["validate", "--config", str(REPO / "configs/validate_tiny.yaml"), "--set", "generation.prompts=3",
                     "--set", f"ranking.ranking_dir={tmp_path}"]) == 2
    assert seen["cfg"].generation.prompts == 3 and seen["cfg"].ranking.ranking_dir == str(tmp_path)
    assert "stopped after the config" in capsys.readouterr().err
    assert cli.main(["validate", "--config", str(REPO / "configs/validate_tiny.yaml"), "--set", "generation.promts=3"]) == 2
    assert "unknown key 'promts' at 'generation'" in capsys.readouterr().err


def test_progress_false_quiets_the_libraries_and_true_does_not(monkeypatch):
    import pipelines.rank_pool as rank_pool

    for flag, quiet in (("false", True), ("true", False)):
        seen = _capture_run(monkeypatch, rank_pool)
        with pytest.raises(SystemExit):
            cli.main(["rank", "--config", str(REPO / "configs/tiny.yaml"), "--set", f"progress={flag}"])
        assert seen.get("quiet", False) is quiet


# --------------------------------------------------------------------------- relative paths

def test_relative_paths_resolve_against_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "records.jsonl").write_text('{"prompt": "a", "reference": "b"}\n')
    config = tmp_path / "configs" / "c.yaml"
    config.write_text(yaml.safe_dump({"pool": {"target": "tiny", "drafters": ["ngram:2"]},
                                      "data": {"source": "./records.jsonl"}}))
    monkeypatch.chdir(tmp_path)  # the file is here, not beside the config
    assert load_yaml(config, RankConfig).data.source == "./records.jsonl"
    monkeypatch.chdir(tmp_path / "configs")  # beside the config it is not
    with pytest.raises(ValueError, match="no such data file"):
        load_yaml(config, RankConfig)


# --------------------------------------------------------------------------- missing prerequisite

def test_validate_without_a_ranking_says_what_to_run(tmp_path, monkeypatch, capsys):
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["validate", "--config", "configs/validate_tiny.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("mdboost validate: error: no ranking in outputs/rank-tiny (no ranking.csv): "
                   "run `mdboost rank --config configs/tiny.yaml` first (--debug shows the traceback)")
    assert cli.main(["validate", "--config", "configs/validate_tiny.yaml", "--set", "ranking.ranking_dir=elsewhere"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("mdboost validate: error: no ranking in elsewhere (no ranking.csv): run `mdboost rank --config "
                   "<your ranking config> --set output_dir=elsewhere` first (--debug shows the traceback)")


def test_validate_config_defaults_point_at_the_default_ranking(tmp_path, monkeypatch):
    from pipelines.prerequisites import rank_configs_writing

    shutil.copytree(REPO / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    assert rank_configs_writing(ValidateConfig().ranking.ranking_dir) == ["configs/default.yaml"]
    assert rank_configs_writing("outputs/validate-tiny") == []  # a validation config's output is no ranking


def test_the_loader_docstring_examples_run():
    import doctest

    import pipelines.loader

    result = doctest.testmod(pipelines.loader)
    assert result.attempted >= 3 and result.failed == 0


@pytest.mark.parametrize("module", ["pipelines.validate_pairs", "pipelines.profile_costs", "pipelines.config",
                                    "pipelines.stages"])
def test_the_pipelines_docstring_examples_run(module):
    """The pipelines are not collected with --doctest-modules (testpaths: tests, mdboost): run theirs here."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted >= 1 and result.failed == 0
