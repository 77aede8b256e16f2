"""The entry points of ``mdboost rank | profile | validate``: :mod:`mdboost.cli` hands over to them.

Each reads and checks its YAML config first (:func:`pipelines.loader.load_yaml`; the schemas,
:mod:`pipelines.config` and :mod:`pipelines.validate_config`, import no torch), then imports its
pipeline, whose modules load torch, transformers and scikit-learn (seconds), and runs it on the
loaded config: a config error is answered at once.
"""

from __future__ import annotations

from pipelines.config import RankConfig
from pipelines.loader import load_yaml
from pipelines.validate_config import ValidateConfig


def rank(config: str, overrides=(), costs=None) -> int:
    """``mdboost rank``: :func:`pipelines.rank_pool.main` on the config, once it is checked."""
    cfg = load_yaml(config, RankConfig, overrides)
    from pipelines.rank_pool import main  # deferred: the pipeline imports torch and the ranking (seconds)

    return main(cfg, costs=costs)


def profile(config: str, overrides=(), out: str | None = None) -> int:
    """``mdboost profile``: :func:`pipelines.profile_costs.main` on the config, once it is checked."""
    cfg = load_yaml(config, RankConfig, overrides)
    from pipelines.profile_costs import main  # deferred: the pipeline imports torch and the cache (seconds)

    return main(cfg, out=out)


def validate(config: str, overrides=()) -> int:
    """``mdboost validate``: :func:`pipelines.validate_pairs.main` on the config, once it is checked."""
    cfg = load_yaml(config, ValidateConfig, overrides)
    from pipelines.validate_pairs import main  # deferred: the pipeline imports torch and the engine (seconds)

    return main(cfg)
