"""Where mdboost keeps converted models, fitted translators and other derived files.

``MDBOOST_HOME`` (environment variable) wins; the default is ``~/.cache/mdboost``.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "MDBOOST_HOME"


def mdboost_home(home: str | os.PathLike | None = None) -> Path:
    """Resolve the mdboost home folder (not created).

    Parameters
    ----------
    home : path or None
        Explicit folder; ``None`` reads ``$MDBOOST_HOME``, else ``~/.cache/mdboost``.
    """
    if home is None:
        home = os.environ.get(ENV_VAR) or Path.home() / ".cache" / "mdboost"
    return Path(home).expanduser().resolve()


def models_dir(home: str | os.PathLike | None = None) -> Path:
    """``<home>/models``: one sub-folder per converted model."""
    return mdboost_home(home) / "models"
