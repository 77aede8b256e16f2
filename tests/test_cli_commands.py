"""The command line as the ecosystem's tools behave: ``--version``, argparse errors under the
subcommand's usage, the docstring naming only real subcommands, and every class of user error
(config-time drafter spec, vocabulary mismatch, hub name while offline or unreachable) one line
with exit code 2, the traceback only behind ``--debug``."""

import os
import re
import socket
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest
import yaml

import mdboost
from mdboost import cli
from mdboost.models import loading

REPO = Path(__file__).resolve().parents[1]


def _cli(*args, env=None, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "mdboost.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"mdboost {project}" == f"mdboost {mdboost.__version__}"


def test_python_dash_m_mdboost_is_the_command():
    """``python -m mdboost`` runs the same command line as ``mdboost`` (and ``python -m mdboost.cli``):
    its version, and a user's mistake as one line with exit code 2 under the command's own name."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    version = subprocess.run([sys.executable, "-m", "mdboost", "--version"], env=env, capture_output=True, text=True,
                             timeout=120)
    assert (version.returncode, version.stdout.strip()) == (0, f"mdboost {mdboost.__version__}"), version.stderr
    bad = subprocess.run([sys.executable, "-m", "mdboost", "export", "--ranking", "/nonexistent/ranking"], env=env,
                         capture_output=True, text=True, timeout=120)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith("mdboost export: "), bad.stderr


@pytest.mark.parametrize("argv, usage, message", [
    (["rank", "--config", "c.yaml", "--bogus"], "usage: mdboost rank", "unrecognized arguments: --bogus"),
    (["rank"], "usage: mdboost rank", "the following arguments are required: --config"),
    (["validate", "--config", "c.yaml", "stray"], "usage: mdboost validate", "unrecognized arguments: stray"),
    (["ui", "--port", "x"], "usage: mdboost ui", "invalid int value: 'x'"),
    (["export", "--ranking", "r", "--format", "yaml"], "usage: mdboost export", "invalid choice: 'yaml'"),
])
def test_a_malformed_command_line_is_reported_under_the_subcommand_usage(capsys, argv, usage, message):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith(usage) and message in err, err


def test_the_docstring_names_exactly_the_subcommands():
    parser = cli.build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    named = set(re.findall(r"``(\w+)``", cli.__doc__.splitlines()[0].split(":", 1)[1]))
    assert named == set(action.choices), (named, set(action.choices))


def test_ui_takes_artifacts_root_and_the_env_store(monkeypatch):
    from mdboost.tracking import ui

    seen = {}
    monkeypatch.setattr(ui, "main", lambda **kw: seen.update(kw) or 0)
    assert cli.main(["ui", "--artifacts-root", "/tmp/art"]) == 0
    assert seen == {"tracking_uri": None, "artifact_root": "/tmp/art", "port": 5000, "host": "127.0.0.1"}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///from-env.db")
    cmd = ui.server_command(ui.resolve_tracking_uri(None))
    assert cmd[cmd.index("--backend-store-uri") + 1] == "sqlite:///from-env.db"


# --------------------------------------------------------------------------- user errors: exit 2, one line

def _write(tmp_path, **sections) -> Path:
    data = yaml.safe_load((REPO / "configs/tiny.yaml").read_text())
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    data.update(output_dir=str(tmp_path / "out"))
    data["cache"]["dir"] = str(tmp_path / "cache")
    data["tracking"]["enabled"] = False
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_bad_drafter_spec_fails_at_config_time_before_any_model_loads(tmp_path, monkeypatch, capsys):
    import mdboost.models.pool as pool

    monkeypatch.setattr(pool, "load_model", lambda *a, **k: pytest.fail("no model may load for a bad spec"))
    for spec in ("early_exit:99", "tuned:0", "ngram:x"):
        path = _write(tmp_path, pool={"drafters": ["ngram:2", spec]})
        assert cli.main(["rank", "--config", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "drafters[1]" in err and spec in err, err


def test_a_vocabulary_mismatch_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys):
    from mdboost.models.tiny import tiny_llama, tiny_tokenizer

    other = tmp_path / "other-vocab"
    tiny_llama(vocab_size=70).save_pretrained(other)
    tiny_tokenizer(70).save_pretrained(other)
    path = _write(tmp_path, pool={"drafters": [str(other)]})
    assert cli.main(["rank", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mdboost rank: error: vocabulary mismatch:"), err
    assert str(other) in err and "Traceback" not in err
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        cli.main(["rank", "--config", str(path), "--debug"])


def test_the_installed_command_hides_the_traceback_unless_debug(tmp_path):
    from mdboost.models.tiny import tiny_llama, tiny_tokenizer

    other = tmp_path / "other-vocab"
    tiny_llama(vocab_size=70).save_pretrained(other)
    tiny_tokenizer(70).save_pretrained(other)
    path = _write(tmp_path, pool={"drafters": [str(other)]})
    quiet, loud = _cli("rank", "--config", str(path)), _cli("--debug", "rank", "--config", str(path))
    assert quiet.returncode == 2 and len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr
    assert "vocabulary mismatch" in quiet.stderr and "Traceback" not in quiet.stderr
    assert loud.returncode == 1 and "Traceback (most recent call last)" in loud.stderr
    assert "vocabulary mismatch" in loud.stderr


def test_a_hub_name_while_offline_fails_at_config_time_saying_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = _write(tmp_path, pool={"target": "nosuch-org/nosuch-model", "drafters": ["ngram:2"]})
    assert cli.main(["rank", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'nosuch-org/nosuch-model'" in err, err
    assert "HF_HUB_OFFLINE is set" in err and "local model folder" in err and "with HF_HUB_OFFLINE unset" in err


def test_hub_offline_reads_the_env_and_huggingface_hub_constant(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert loading.hub_offline() is False
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert loading.hub_offline() is True
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert loading.hub_offline() is True


class _CountingHub:
    """A TCP server that counts requests about a model and drops each unanswered: a hub that
    cannot answer."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.connections, self._stop = 0, threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(5)
            try:
                request = conn.recv(65536)  # the request arrived; no answer comes
            except OSError:
                request = b""
            # huggingface_hub's own once-per-process bookkeeping request is not about the model
            self.connections += b"/api/models/" in request.split(b"\r\n", 1)[0]
            conn.close()

    def close(self):
        self._stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def unreachable_hub(monkeypatch):
    """The hub is not declared offline but cannot answer (its endpoint drops every connection)."""
    from huggingface_hub import constants

    hub = _CountingHub()
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    yield hub
    hub.close()


def test_an_unreachable_hub_fails_at_once_with_one_request(unreachable_hub):
    with pytest.raises(ValueError) as err:
        loading.check_model_source("nosuch-org/nosuch-model")
    message = str(err.value)
    assert "the hub cannot be reached" in message and "HF_HUB_OFFLINE=1" in message and "local model folder" in message
    assert unreachable_hub.connections == 1  # no retries


def test_loading_an_uncached_hub_name_asks_the_hub_once(unreachable_hub):
    with pytest.raises(ValueError, match="cannot be reached.*HF_HUB_OFFLINE=1"):
        loading.load_model("nosuch-org/nosuch-model", device="cpu")
    assert unreachable_hub.connections == 1


def test_an_unreachable_hub_in_a_config_is_one_line_exit_2(tmp_path, unreachable_hub, capsys):
    path = _write(tmp_path, pool={"target": "nosuch-org/nosuch-model", "drafters": ["ngram:2"]})
    assert cli.main(["rank", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot be reached" in err and "'nosuch-org/nosuch-model'" in err, err
