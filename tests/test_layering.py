"""The library never imports pipeline configuration: nothing under ``mdboost/`` imports
``pipelines`` (where the YAML schema lives) or names its config classes."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted((ROOT / "mdboost").rglob("*.py"))
CONFIG_CLASSES = {"RankConfig", "ValidateConfig", "PoolConfig", "DataConfig", "CacheConfig", "MDConfig", "SpeedConfig",
                  "BoostingConfig", "RuleConfig", "TrackingConfig", "SourceConfig", "GenerationConfig", "HumanEvalConfig"}


def _imports(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out += [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
    return out


def test_the_walk_sees_the_library():
    assert len(LIBRARY) > 40 and ROOT / "mdboost" / "cache" / "pool_cache.py" in LIBRARY


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pipeline_config_in_the_library(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [m for m in _imports(tree) if m == "pipelines" or m.startswith(("pipelines.", "mdboost.config"))]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & CONFIG_CLASSES, f"{path.relative_to(ROOT)} uses {sorted(names & CONFIG_CLASSES)}"


def test_the_check_catches_an_import():
    tree = ast.parse("from pipelines.config import RankConfig\nimport mdboost.config\n")
    assert _imports(tree) == ["pipelines.config", "pipelines.config.RankConfig", "mdboost.config"]
