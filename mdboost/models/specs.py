"""Drafter specs, read without loading anything: ``early_exit:N``, ``tuned:N``, ``int8``, ``ngram:N``, a model.

A light module (no torch, no transformers) so that reading a ranking's drafter names, as
``mdboost export`` does, stays fast; :mod:`mdboost.models.pool` builds the drafters they name.
"""

from __future__ import annotations

import re
from pathlib import Path

from .convert import SMOLLM2_ALIAS

_SPEC = re.compile(r"(early_exit|tuned|ngram):(\d+)|(int8)")


def parse_drafter(spec: str) -> tuple[str, int | None]:
    """``"tuned:12"`` -> ``("tuned", 12)``; ``"int8"`` -> ``("int8", None)``; else ``("hf", None)``."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"drafter spec must be a non-empty string, got {spec!r}")
    match = _SPEC.fullmatch(spec)
    if match is None:
        if re.fullmatch(r"(early_exit|tuned|ngram):.*", spec):
            raise ValueError(f"drafter spec {spec!r} needs a positive integer after ':'")
        return "hf", None
    if match.group(3):
        return "int8", None
    return match.group(1), int(match.group(2))


def drafter_identity(spec: str) -> str:
    """The drafter a spec names, spelled one way: two specs with the same identity build the same
    drafter. ``"early_exit:02"`` -> ``"early_exit:2"``, ``"INT8"`` stays a model name; a model
    that is a local folder is named by its absolute path (``./m`` and ``m`` are one), the
    SmolLM2 alias in lower case.

    >>> drafter_identity("early_exit:02"), drafter_identity("ngram:3"), drafter_identity("int8")
    ('early_exit:2', 'ngram:3', 'int8')
    """
    kind, n = parse_drafter(spec)
    if kind != "hf":
        return kind if n is None else f"{kind}:{n}"
    if spec.lower() == SMOLLM2_ALIAS:
        return SMOLLM2_ALIAS
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec


def same_drafters(specs: list[str]) -> list[tuple[str, str]]:
    """The pairs of ``specs`` (in their order) that name the same drafter (:func:`drafter_identity`).

    >>> same_drafters(["early_exit:2", "tuned:2", "early_exit:02"])
    [('early_exit:2', 'early_exit:02')]
    """
    first, pairs = {}, []
    for spec in specs:
        identity = drafter_identity(spec)
        if identity in first:
            pairs.append((first[identity], spec))
        else:
            first[identity] = spec
    return pairs
