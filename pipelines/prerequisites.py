"""What to run first: the message of a pipeline step whose input another step makes.

``mdboost validate`` reads a ranking that ``mdboost rank`` writes. When the ranking is missing,
:func:`missing_ranking` says which command makes it: the shipped config (``configs/*.yaml``,
relative to the working directory like every path of a config) whose ``output_dir`` is that
folder, else any ranking config with ``--set output_dir=<folder>``.
"""

from __future__ import annotations

from pathlib import Path

import yaml


def rank_configs_writing(folder: str | Path, configs_dir: str | Path = "configs") -> list[str]:
    """The ranking configs under ``configs_dir`` whose ``output_dir`` is ``folder`` (sorted paths).

    A ranking config is a YAML mapping without the validation sections (``generation``,
    ``ranking.ranking_dir`` / ``ranking.ranking_run_id``); paths compare after resolving against
    the working directory. Unreadable files are skipped.
    """
    target, found = Path(folder).expanduser().resolve(), []
    for path in sorted(Path(configs_dir).glob("*.y*ml")):
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(data, dict) or "generation" in data:
            continue
        ranking = data.get("ranking")
        if isinstance(ranking, dict) and ("ranking_dir" in ranking or "ranking_run_id" in ranking):
            continue
        out = data.get("output_dir", "outputs/rank")  # RankConfig's default
        if isinstance(out, str) and Path(out).expanduser().resolve() == target:
            found.append(str(path))
    return found


def missing_ranking(folder: str | Path, missing: str) -> str:
    """``no ranking in <folder> (no <missing>): run `mdboost rank --config ...` first``."""
    configs = rank_configs_writing(folder)
    command = (f"mdboost rank --config {configs[0]}" if configs
               else f"mdboost rank --config <your ranking config> --set output_dir={folder}")
    return f"no ranking in {folder} (no {missing}): run `{command}` first"
