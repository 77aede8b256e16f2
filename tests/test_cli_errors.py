"""A user's mistake on the command line: one line naming the key, exit code 2, the traceback only
behind ``--debug``; malformed configs are refused when the config is checked, before any work."""

import os
import subprocess
import sys

import pytest
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
    "unknown backend with one job": ({"cache": {"backend": "nonexistent_backend", "n_jobs": 1}}, "'cache'",
                                     "nonexistent_backend"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_is_one_line_naming_the_key(tmp_path, capsys, monkeypatch, case):
    import pipelines.rank_pool as rank_pool

    sections, key, value = BAD[case]
    path = write_config(tmp_path, **sections)
    monkeypatch.setattr(rank_pool, "run", lambda cfg: pytest.fail("a bad config must not start the pipeline"))
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

    def fails(cfg):
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
