"""Every option of every ``mdboost`` subcommand says what it does, and its default where it has one."""

from __future__ import annotations

import argparse

import pytest

from mdboost.cli import build_parser


def _subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(action.choices.items())


@pytest.mark.parametrize("name, sub", _subcommands())
def test_every_option_has_help_and_names_its_default(name, sub):
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"mdboost {name} {action.option_strings}: no help text"
        has_default = action.default not in (None, False, [], argparse.SUPPRESS) and not action.required
        if has_default:
            assert "default" in action.help, f"mdboost {name} {action.option_strings}: default {action.default!r} unsaid"


def test_mdboost_export_reads_a_ranking_without_torch(tmp_path):
    """``mdboost export`` answers at once: reading a ranking and printing a server command import
    neither torch nor transformers (seconds each); only a rule's Python repr needs the rules."""
    import subprocess
    import sys

    code = ("import sys, mdboost.cli, mdboost.export\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'sklearn', 'mlflow') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
