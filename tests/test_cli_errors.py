"""A user's mistake on the command line: one line naming the key, exit code 2, the traceback only
behind ``--debug``; malformed configs are refused when the config is checked, before any work."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from mdboost import cli
from pipelines.config import RankConfig
from pipelines.loader import load_yaml, to_dict


def write_config(tmp_path, **sections):
    data = to_dict(load_yaml("configs/tiny.yaml", RankConfig))
    for section, values in sections.items():
        data[section].update(values)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BAD = {
    "missing data file": ({"data": {"source": "no/such/records.jsonl"}}, "'data'", "no/such/records.jsonl"),
    "missing model path": ({"pool": {"target": "./no-such-model"}}, "'pool'", "no-such-model"),
    "missing drafter path": ({"pool": {"drafters": ["/no/such/drafter"]}}, "drafters[0]", "/no/such/drafter"),
    "drafter depth not a number": ({"pool": {"drafters": ["early_exit:x"]}}, "drafters[0]", "early_exit:x"),
    "drafter deeper than the target": ({"pool": {"drafters": ["ngram:2", "early_exit:99"]}}, "drafters[1]",
                                       "early_exit:99"),
    "tuned depth at the last layer": ({"pool": {"drafters": ["tuned:4"]}}, "drafters[0]", "tuned:4"),
    "the target as its only drafter": ({"pool": {"drafters": ["tiny"]}}, "drafters[0]", "target itself"),
    "a misspelt drafter kind": ({"pool": {"drafters": ["foo:3"]}}, "drafters[0]", "drafter specs are ngram:N"),
    "unknown backend with one job": ({"cache": {"backend": "nonexistent_backend", "n_jobs": 1}}, "'cache'",
                                     "nonexistent_backend"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_is_one_line_naming_the_key(tmp_path, capsys, monkeypatch, case):
    import pipelines.rank_pool as rank_pool

    sections, key, value = BAD[case]
    path = write_config(tmp_path, **sections)
    monkeypatch.setattr(rank_pool, "run", lambda cfg, costs=None: pytest.fail("a bad config must not start the pipeline"))
    assert cli.main(["rank", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and value in err, err


def test_yaml_syntax_error_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("pool:\n  target: tiny\n  drafters: [ngram:2\ncache: {}\n")
    assert cli.main(["rank", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "broken.yaml" in err and "not valid YAML at line" in err, err


def test_a_runtime_error_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    import pipelines.rank_pool as rank_pool

    def fails(cfg, costs=None):
        raise ValueError("records file vanished:\n  /data/x.jsonl")

    monkeypatch.setattr(rank_pool, "run", fails)
    path = write_config(tmp_path)
    assert cli.main(["rank", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("mdboost rank: error: records file vanished: /data/x.jsonl (--debug shows the traceback)")
    with pytest.raises(ValueError, match="vanished"):
        cli.main(["rank", "--config", str(path), "--debug"])
    with pytest.raises(ValueError, match="vanished"):
        cli.main(["--debug", "rank", "--config", str(path)])


def test_the_installed_command_exits_2(tmp_path):
    path = write_config(tmp_path, pool={"drafters": ["early_exit:99"]})
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    done = subprocess.run([sys.executable, "-m", "mdboost.cli", "rank", "--config", str(path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "early_exit:99" in done.stderr


CHEAP = {  # command, a config with a cheap mistake (in one, beside mistakes of the last checks), its message
    "a bad budget": ("rank", "md:\n  budgets: [-1]\n", "config error at 'md': invalid budgets"),
    "a bad budget beside a pool, rules and a store the heavy checks refuse": (
        "rank", "pool:\n  drafters: [early_exit:99]\n  device: cuda:7\n"
                "md:\n  budgets: [-1]\n  rules: [{rule: rejection, drafting: sampled, draft_p_min: 0.5}]\n"
                "tracking:\n  tracking_uri: bogus://x\n", "config error at 'md': invalid budgets"),
    "a root check": ("rank", "output_dir: configs/tiny.yaml\n", "invalid output_dir"),
    "a drafter's syntax": ("rank", "pool:\n  drafters: [early_exit:x]\n", "invalid drafters[0]"),
    "one drafter twice": ("rank", "pool:\n  drafters: [early_exit:2, early_exit:02]\n", "duplicates"),
    "a rule name": ("rank", "md:\n  rules: [{rule: lenient}]\n", "md.rules[0].rule"),
    "a backend": ("rank", "cache:\n  backend: nonexistent_backend\n", "nonexistent_backend"),
    "a data limit": ("rank", "data:\n  limit: 0\n", "limit"),
    "profile's config": ("profile", "speed:\n  gamma_min: 0\n", "gamma range"),
    "validate's config": ("validate", "generation:\n  top_p: 2\n", "top_p"),
    "a misspelt model drafter": ("rank", "pool:\n  drafters: [early_exit:12, smolm2-typo]\n", "invalid drafters[1]"),
    "a drafter too deep": ("rank", "pool:\n  drafters: [early_exit:99]\n", "invalid drafters[0]"),
    "a missing target file": ("rank", "pool:\n  target: ./nosuch.gguf\n", "invalid target"),
}


@pytest.mark.parametrize("case", sorted(CHEAP))
def test_a_cheap_config_error_loads_no_torch(tmp_path, case):
    """A config with a cheap mistake is answered before torch, transformers or scikit-learn load
    (seconds): the checks that need them run after every cheap check, and a model that cannot be
    found (the hub off) is found so without them (a property, not a timing)."""
    command, text, message = CHEAP[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code = ("import sys\nfrom mdboost import cli\n"
            f"try:\n    cli.main([{command!r}, '--config', {str(path)!r}, '--debug'])\n"
            "except ValueError as err:\n    print(err)\nelse:\n    sys.exit('no config error')\n"
            "print(sorted(m for m in ('torch', 'transformers', 'sklearn') if m in sys.modules))\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root,
                          env=dict(os.environ, PYTHONPATH=str(root), HF_HUB_OFFLINE="1"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    error, loaded = done.stdout.strip().splitlines()
    assert message in error and loaded == "[]", done.stdout


def test_library_checks_name_the_argument():
    from mdboost.cache.keys import PoolCacheSpec
    from mdboost.data import TextSource
    from mdboost.models.pool import check_drafter

    with pytest.raises(ValueError, match="backend must be one of .*'nonexistent_backend'"):
        PoolCacheSpec(dir="x", text=TextSource(), target="tiny", drafters=("ngram:2",), backend="nonexistent_backend")
    with pytest.raises(ValueError, match=r"'early_exit:4'.*\[1, 3\]"):
        check_drafter("early_exit:4", "tiny")
    check_drafter("early_exit:29", "smollm2-135m")
    with pytest.raises(ValueError, match="early_exit:30"):
        check_drafter("early_exit:30", "smollm2-135m")


@pytest.mark.parametrize("overrides, key, value", [
    (["pool.device=cuda:7"], "'pool'", "cuda:7"),
    (["tracking.tracking_uri=bogus://x"], "tracking_uri", "bogus://x"),
    (["md.budgets=[0, .inf]"], "budgets", "inf"),
    (["md.temperatures=[.inf]"], "temperatures", "inf"),
])
def test_more_mistakes_are_config_errors_before_any_work(tmp_path, capsys, monkeypatch, overrides, key, value):
    import pipelines.rank_pool as rank_pool

    if overrides[0].startswith("pool.device") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    monkeypatch.setattr(rank_pool, "run", lambda cfg, costs=None: pytest.fail("a bad config must not start the pipeline"))
    argv = ["rank", "--config", str(write_config(tmp_path))] + [a for o in overrides for a in ("--set", o)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mdboost rank: config error") and key in err and value in err, err


def test_config_errors_and_interrupts_with_and_without_debug(tmp_path, capsys, monkeypatch):
    import pipelines.rank_pool as rank_pool

    path = write_config(tmp_path)
    bad = ["rank", "--config", str(path), "--set", "md.budgts=[0]"]
    assert cli.main(bad) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdboost rank: config error: unknown key 'budgts' at 'md'") and len(err.splitlines()) == 1
    with pytest.raises(ValueError, match="unknown key 'budgts'"):
        cli.main(bad + ["--debug"])

    def interrupted(cfg, costs=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(rank_pool, "run", interrupted)
    assert cli.main(["rank", "--config", str(path)]) == 130
    assert capsys.readouterr().err.strip() == "mdboost rank: interrupted"
    with pytest.raises(KeyboardInterrupt):
        cli.main(["rank", "--config", str(path), "--debug"])


def test_a_failed_rerun_leaves_the_previous_outputs_and_export_checks_the_csv(tmp_path, capsys, monkeypatch):
    import json

    import pipelines.rank_pool as rank_pool

    out = tmp_path / "out"
    path = write_config(tmp_path, tracking={"enabled": False})
    argv = ["rank", "--config", str(path), "--set", f"output_dir={out}", "--set", f"cache.dir={tmp_path / 'cache'}"]
    assert cli.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert cli.main(["export", "--ranking", str(out)]) == 0
    capsys.readouterr()
    csv = (out / "ranking.csv").read_bytes()
    (out / "ranking.csv").write_bytes(csv.replace(b"\n", b"\n", 1) + b"\n")  # another ranking.csv
    assert cli.main(["export", "--ranking", str(out)]) == 2
    assert "ranking.csv is not the one its summary.json was written with" in capsys.readouterr().err
    (out / "ranking.csv").write_bytes(csv)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    monkeypatch.setattr(rank_pool.report, "write_html", broken)  # the rerun fails after ranking.csv
    assert cli.main(argv) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # the previous run's, whole
    assert json.loads((out / "summary.json").read_text()) == summary
    assert cli.main(["export", "--ranking", str(out)]) == 0
    capsys.readouterr()
    (out / "summary.json").unlink()  # a folder without its summary (written by hand, or an older version's)
    assert cli.main(["export", "--ranking", str(out)]) == 2
    assert "has no summary.json" in capsys.readouterr().err
    val = tmp_path / "val.yaml"
    val.write_text(yaml.safe_dump({"ranking": {"ranking_dir": str(out)}, "output_dir": str(tmp_path / "val"),
                                   "tracking": {"enabled": False}}))
    assert cli.main(["validate", "--config", str(val)]) == 2
    assert "has ranking files but no summary.json" in capsys.readouterr().err
    assert not (tmp_path / "val").exists()
