"""The ``mdboost`` command: ``rank``, ``validate``, ``ui``, ``export`` and ``demo``.

Each subcommand only parses arguments and hands over to a pipeline entry point
(``pipelines/``) or a library function.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module


def _run(target: str, **kwargs):
    module, func = target.split(":")
    return getattr(import_module(module), func)(**kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mdboost", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)

    rank = sub.add_parser("rank", help="rank drafter/target pairs of a pool (pipelines/rank_pool.py)")
    rank.add_argument("--config", required=True, help="YAML config, e.g. configs/default.yaml")
    rank.set_defaults(target="pipelines.rank_pool:main")

    validate = sub.add_parser("validate", help="run real MD generation on ranked pairs (pipelines/validate_pairs.py)")
    validate.add_argument("--config", required=True, help="YAML config, e.g. configs/validate_default.yaml")
    validate.set_defaults(target="pipelines.validate_pairs:main")

    ui = sub.add_parser("ui", help="start the MLflow UI on localhost over the project's store")
    ui.add_argument("--tracking-uri", default=None, help="default: sqlite:///mlruns/mlflow.db")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--host", default="127.0.0.1")
    ui.set_defaults(target="mdboost.tracking.ui:main")

    export = sub.add_parser("export", help="print what to run for a ranking's recommendation "
                                           "(mdboost, HF generate, vLLM)")
    export.add_argument("--ranking", required=True,
                        help="a ranking output folder (e.g. outputs/rank) or its MLflow run id")
    export.add_argument("--format", default="json", choices=["json", "mdboost", "hf", "vllm"])
    export.add_argument("--tracking-uri", default=None, help="store of a run id (default: $MLFLOW_TRACKING_URI, "
                                                             "else sqlite:///mlruns/mlflow.db)")
    export.set_defaults(target="mdboost.cli:export_main")
    return parser


def export_main(ranking: str, format: str = "json", tracking_uri: str | None = None) -> int:
    """``mdboost export``: print the recommendation's calls (:mod:`mdboost.export`)."""
    import os

    from mdboost.export import export_plan, load_ranking, render
    from mdboost.tracking.store import DEFAULT_TRACKING_URI

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    print(render(export_plan(load_ranking(ranking, tracking_uri=uri)), format))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; a ``ValueError`` / ``OSError`` (a user's mistake: a bad config value, a
    missing file) prints one line and returns 2, its traceback shown only with ``--debug``
    (accepted anywhere on the command line)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = vars(build_parser().parse_args([a for a in argv if a != "--debug"]))
    command, target = args.pop("command"), args.pop("target")
    args.pop("debug", None)
    try:
        result = _run(target, **args)
    except (ValueError, OSError) as err:
        if "--debug" in argv:
            raise
        print(f"mdboost {command}: error: {' '.join(str(err).split())} (--debug shows the traceback)", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
