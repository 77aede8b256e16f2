"""Where a model comes from, checked without loading it: torch-free.

:func:`check_model_source` (an alias, a local path, the local hub cache, or one quick question to
the hub) and :func:`check_drafter` (a pool spec's syntax, depth and model) answer before any model
loads, and this module imports neither torch nor transformers, so a config with a misspelt model
is answered at once (``pipelines/config.py``). :mod:`mdboost.models.loading` and
:mod:`mdboost.models.pool` re-export them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from huggingface_hub import HfApi, constants
from huggingface_hub.errors import RepositoryNotFoundError
from huggingface_hub.utils import HFValidationError, validate_repo_id

from .convert import SMOLLM2_ALIAS, SMOLLM2_LAYERS
from .home import models_dir
from .identity import TINY_NAME, hub_revision
from .specs import parse_drafter

__all__ = ["DEFAULT_NUM_LAYERS", "check_drafter", "check_model_source", "hub_offline", "offline_hint", "target_depth"]

DEFAULT_NUM_LAYERS = 4
"""Decoder layers of the ``tiny`` alias (:func:`mdboost.models.tiny.tiny_llama`'s default)."""


def hub_offline() -> bool:
    """Whether the hub is off: ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` in the environment
    now, or ``huggingface_hub.constants.HF_HUB_OFFLINE`` (read when that package was imported)."""
    if any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return True
    return bool(constants.HF_HUB_OFFLINE)


def _reads_as_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.endswith(".gguf")


def offline_hint(name: str, offline: bool = False) -> str:
    """What to do about a hub name that cannot be had: a local folder, or the local hub cache
    (filled once where the hub is reachable; with ``HF_HUB_OFFLINE=1`` nothing asks the hub)."""
    folder = f"give a local model folder instead (e.g. ./models/{name.rsplit('/', 1)[-1]}, made with save_pretrained)"
    if offline:
        return f"{folder}, or download it once with HF_HUB_OFFLINE unset to fill the local hub cache"
    return f"{folder}, or download it once where the hub is reachable and set HF_HUB_OFFLINE=1 to use the local hub cache"


def _hub_unreachable(name: str, timeout: float = 5.0) -> str | None:
    """One request to the hub about ``name`` (no retries): why it cannot be used, or None.

    None also when the hub answers with a client error other than "no such model" (a gated or
    private model): loading then reports it the usual way; a server error (5xx) counts as
    unreachable (transformers would retry it).
    """
    try:
        HfApi().model_info(name, timeout=timeout)  # a fresh client: the endpoint configured now
    except RepositoryNotFoundError:
        return f"model {name!r} is not a local path and there is no such model on the hub"
    except Exception as err:  # noqa: BLE001 -- connection refused, DNS, timeout, proxy, 5xx: all "unreachable"
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status is not None and status < 500:
            return None  # the hub answered (gated, private, rate-limited): loading says what it says
        return (f"model {name!r} is not a local path, not in the local hub cache, and the hub cannot be reached "
                f"({type(err).__name__}{'' if status is None else f' {status}'})")
    return None


def check_model_source(name: str) -> None:
    """Raise ``ValueError`` (naming ``name``) when :func:`load_model` cannot find it, without loading.

    An alias passes; a name that reads as a path (``/``, ``.`` or ``~`` first, or a ``.gguf``
    file) must exist; any other name must be a local path or a model in the local hub cache,
    or, unless the hub is off (:func:`hub_offline`), a model the hub knows: one request with a
    short timeout and no retries, so an unreachable hub fails here at once, before any model
    is loaded. The message says how to use a local path or the hub cache offline.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty model name or path, got {name!r}")
    if TINY_NAME.fullmatch(name) or name.lower() == SMOLLM2_ALIAS:
        return
    path = Path(name).expanduser()
    if _reads_as_path(name):
        if not (path.is_file() if name.endswith(".gguf") else path.exists()):
            raise ValueError(f"model {name!r}: no such {'GGUF file' if name.endswith('.gguf') else 'model folder'}")
    elif not path.exists() and hub_revision(name) is None:
        try:  # not a name the hub could hold: say so (no request, no "unreachable")
            validate_repo_id(name)
        except HFValidationError as err:
            raise ValueError(f"model {name!r} is neither a local path nor a valid hub model name "
                             f"({' '.join(str(err).split())})") from None
        offline = hub_offline()
        why = (f"model {name!r} is not a local path and not in the local hub cache (HF_HUB_OFFLINE is set)"
               if offline else _hub_unreachable(name))
        if why is not None:
            raise ValueError(f"{why}: {offline_hint(name, offline)}")


def target_depth(target: str, home=None) -> int | None:
    """The target's number of decoder layers, read without loading it (None when unknown)."""
    if TINY_NAME.fullmatch(target):
        return DEFAULT_NUM_LAYERS
    folder = models_dir(home) / SMOLLM2_ALIAS if target.lower() == SMOLLM2_ALIAS else Path(target).expanduser()
    config = folder / "config.json"
    if config.is_file():
        try:
            return int(json.loads(config.read_text())["num_hidden_layers"])
        except (ValueError, KeyError, TypeError):
            return None
    return SMOLLM2_LAYERS if target.lower() == SMOLLM2_ALIAS else None


def check_drafter(spec: str, target: str, home=None) -> None:
    """Raise ``ValueError`` naming ``spec`` unless it can be built for ``target`` (checked without
    loading a model: the spec's syntax, an ``early_exit`` / ``tuned`` depth below the target's
    layer count where that is known, an ``ngram`` order >= 1, a model drafter that can be found)."""
    kind, n = parse_drafter(spec)
    if spec == target:
        raise ValueError(f"drafter {spec!r} is the target itself; list other drafters")
    if kind == "ngram" and n < 1:
        raise ValueError(f"drafter spec {spec!r} needs an order >= 1")
    if kind in ("early_exit", "tuned"):
        depth = target_depth(target, home)
        if n < 1 or (depth is not None and n >= depth):
            raise ValueError(f"drafter spec {spec!r}: the depth must be in [1, {'L - 1' if depth is None else depth - 1}]"
                             f" for target {target!r}" + ("" if depth is None else f" ({depth} layers)"))
    if kind == "hf":
        try:
            check_model_source(spec)
        except ValueError as err:
            if ":" in spec and "valid hub model name" in str(err):  # a misspelt kind, most likely
                raise ValueError(f"{err}; drafter specs are ngram:N, early_exit:N, tuned:N, int8, or a model "
                                 f"name or path") from None
            raise
