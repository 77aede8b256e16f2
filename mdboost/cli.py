"""The ``mdboost`` command: ``rank``, ``profile``, ``validate``, ``export`` and ``ui``.

Each subcommand only parses arguments and hands over to a pipeline entry point
(``pipelines/commands.py``: the config is checked before the pipeline's imports) or a library
function. Conventions, as in the tools ML engineers already use:

- ``mdboost --version``;
- ``--set key.path=value`` (repeatable) on every subcommand that takes a config: the value is
  parsed as YAML and checked by the same strict loader as the file (an unknown key is named),
  then the resolved config is saved with the run (``pipelines.loader.apply_overrides``);
- a malformed command line is reported under the subcommand's own usage (exit code 2);
- a user's mistake found while running (a bad config value, a missing file or model, a
  vocabulary mismatch, a hub name while offline: ``ValueError`` / ``OSError``) prints one line
  ``mdboost <command>: error: ...`` and exits with code 2; ``--debug`` (anywhere on the command
  line) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import import_module

from mdboost import __version__
from mdboost.tracking.store import resolve_tracking_uri


def _run(target: str, **kwargs):
    module, func = target.split(":")
    return getattr(import_module(module), func)(**kwargs)


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a config value (YAML), e.g. --set md.budgets=[0,0.1] --set output_dir=out/x; "
                             "repeatable, later ones win")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mdboost", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)

    rank = sub.add_parser("rank", help="rank drafter/target pairs of a pool (pipelines/rank_pool.py)")
    rank.add_argument("--config", required=True, help="YAML config, e.g. configs/default.yaml")
    rank.add_argument("--costs", action="append", default=None, metavar="PROFILE.json",
                      help="re-score the finished caches with this cost profile (`mdboost profile`, e.g. another "
                           "machine's) instead of this machine's costs; nothing is built or measured; one per "
                           "decoding mode ranked (greedy, sampled)")
    _add_overrides(rank)
    rank.set_defaults(target="pipelines.commands:rank")

    profile = sub.add_parser("profile", help="measure a pool's engine costs on this machine into a portable cost "
                                             "profile (pipelines/profile_costs.py)")
    profile.add_argument("--config", required=True, help="YAML config, e.g. configs/default.yaml")
    profile.add_argument("--out", default=None, metavar="PATH",
                         help="write the profile here (a config ranking greedy and sampled decoding also writes "
                              "PATH's stem + '-greedy'); default: print where the pool's speed file is")
    _add_overrides(profile)
    profile.set_defaults(target="pipelines.commands:profile")

    validate = sub.add_parser("validate", help="run real MD generation on ranked pairs (pipelines/validate_pairs.py)")
    validate.add_argument("--config", required=True, help="YAML config, e.g. configs/validate_default.yaml")
    _add_overrides(validate)
    validate.set_defaults(target="pipelines.commands:validate")

    ui = sub.add_parser("ui", help="start the MLflow UI on localhost over the project's store")
    ui.add_argument("--tracking-uri", default=None,
                    help="store to serve (default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db)")
    ui.add_argument("--artifacts-root", dest="artifact_root", default=None,
                    help="artifact folder of experiments created through the UI (default: mlruns/artifacts)")
    ui.add_argument("--port", type=int, default=5000, help="port of the UI (default: 5000)")
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine "
                                                        "only)")
    ui.set_defaults(target="mdboost.tracking.ui:main")

    export = sub.add_parser("export", help="print what to run for a ranking's recommendation "
                                           "(mdboost, HF generate, vLLM, SGLang, llama.cpp)")
    export.add_argument("--ranking", required=True,
                        help="a ranking output folder (e.g. outputs/rank) or its MLflow run id")
    export.add_argument("--format", default="json", choices=["json", "mdboost", "hf", "vllm", "sglang", "llamacpp"],
                        help="json: every engine's section; mdboost / hf / vllm: the Python call; sglang / llamacpp: "
                             "the server command (a lossy pick on llama.cpp: mdboost's loop in Python) "
                             "(default: json)")
    export.add_argument("--tracking-uri", default=None, help="store of a run id (default: $MLFLOW_TRACKING_URI, "
                                                             "else sqlite:///mlruns/mlflow.db)")
    export.add_argument("--write-drafter", default=None, metavar="DIR",
                        help="write the pick's drafter (early_exit:N or a model) to the new folder DIR as a "
                             "transformers checkpoint and print the engine flags that load it, instead of the plan")
    export.set_defaults(target="mdboost.cli:export_main")
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


def export_main(ranking: str, format: str = "json", tracking_uri: str | None = None,
                write_drafter: str | None = None) -> int:
    """``mdboost export``: print the recommendation's calls (:mod:`mdboost.export`); with
    ``write_drafter``, write the pick's drafter there and print the lines that load it instead."""
    # deferred: mdboost.export imports the ranking and transformers (seconds); mdboost --help and --version stay fast
    from mdboost.export import export_plan, load_ranking, render, render_written, write_pick_drafter

    # stdout is the plan (JSON or code): MLflow's download bars would clutter stderr (a user's setting wins)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    loaded = load_ranking(ranking, tracking_uri=resolve_tracking_uri(tracking_uri))
    if write_drafter is not None:
        print(render_written(write_pick_drafter(loaded, write_drafter)))
        return 0
    print(render(export_plan(loaded), format))
    return 0


def one_line(err: BaseException) -> str:
    """An error's message on one line (newlines and runs of spaces collapsed)."""
    return " ".join(str(err).split()) or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; a ``ValueError`` / ``OSError`` (a user's mistake: a bad config value, a
    missing file or model) prints one line and returns 2, its traceback shown only with
    ``--debug`` (accepted anywhere on the command line); Ctrl-C prints one line and returns 130.
    Arguments the subcommand does not take are reported under its own usage (exit code 2, as
    argparse does)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    parser = build_parser()
    namespace, extra = parser.parse_known_args([a for a in argv if a != "--debug"])
    if extra:
        _subparser(parser, namespace.command).error(f"unrecognized arguments: {' '.join(extra)}")
    args = vars(namespace)
    command, target = args.pop("command"), args.pop("target")
    args.pop("debug", None)
    try:
        result = _run(target, **args)
    except (ValueError, OSError) as err:
        if debug:
            raise
        message = one_line(err)  # a config error already says so ("config error at 'md': ...")
        kind = "" if message.startswith("config error") else "error: "
        print(f"mdboost {command}: {kind}{message} (--debug shows the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT
        if debug:
            raise
        print(f"mdboost {command}: interrupted", file=sys.stderr)
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
