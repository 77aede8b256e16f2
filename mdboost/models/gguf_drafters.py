"""Drafters llama.cpp runs, made from the target's GGUF file: an early exit and a lower-bit quantization.

- ``early_exit:N`` (:func:`truncated_gguf`): the target's GGUF with its first ``N`` blocks, the
  token embedding, the final norm and the output head (``output.weight``, or the embedding when
  the head is tied), ``<arch>.block_count = N``; every kept tensor is copied byte for byte, in
  its own quantization. It is the model :func:`mdboost.models.drafters.early_exit_model` builds
  from the same file (mdboost's converted model holds these weights dequantized), so the two
  differ only by how llama.cpp computes with quantized weights.
- ``quant:<TYPE>`` (:func:`quantized_gguf`): the target requantized by llama.cpp's own
  ``llama_model_quantize`` (llama-cpp-python 0.3.36, ``llama_cpp/llama_cpp.py``: the function at
  line 2106, its parameters ``llama_model_quantize_params`` at line 1157, the ``LLAMA_FTYPE_*``
  numbers at lines 430-444), e.g. ``quant:Q3_K_S`` or ``quant:Q2_K``: what ``llama-quantize
  --allow-requantize`` writes.

:func:`gguf_drafter` makes either one once and keeps it under ``MDBOOST_HOME/gguf``, keyed by
the target file's content (SHA-256) and the spec; every file is written to a temporary name
and renamed into place. Writing a truncated file needs the ``gguf`` package (a dependency);
quantizing needs llama-cpp-python (``pip install 'mdboost[llamacpp]'``).
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from mdboost._io import atomic_path, file_lock, lock_path, sha256_file

from .convert import SMOLLM2_ALIAS, smollm2_gguf
from .home import mdboost_home
from .specs import parse_drafter

__all__ = ["QUANTIZATIONS", "gguf_drafter", "import_llama_cpp", "llama_cpp_available", "llamacpp_cannot",
           "llamacpp_model", "parse_gguf_drafter", "quantized_gguf", "truncated_gguf"]

INSTALL = "pip install 'mdboost[llamacpp]'  (llama-cpp-python 0.3.36, built from its sdist: 15-30 minutes on 2 cores)"

# llama.cpp's ``llama_ftype`` of each quantization ``quant:<TYPE>`` names (llama_cpp.py 430-444 in 0.3.36)
QUANTIZATIONS = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12,
                 "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "Q2_K_S": 21}
FORMAT = 1  # bump when a file's bytes would change for the same target and spec: old cache entries are not read


def llama_cpp_available() -> bool:
    """Whether ``llama_cpp`` (llama-cpp-python) can be imported here."""
    return importlib.util.find_spec("llama_cpp") is not None


def import_llama_cpp(what: str):
    """The ``llama_cpp`` module, or an ImportError saying that ``what`` needs it and how to install it."""
    try:
        import llama_cpp  # deferred: optional (mdboost[llamacpp]); importing mdboost never needs it
    except ImportError as exc:
        raise ImportError(f"{what} needs llama-cpp-python: {INSTALL}") from exc
    return llama_cpp


def llamacpp_model(name: str) -> tuple[str | None, str]:
    """The GGUF file llama.cpp loads for an mdboost model name, and a note; ``(None, reason)``
    where there is none.

    >>> llamacpp_model("/m/q4.gguf")
    ('/m/q4.gguf', '')
    >>> llamacpp_model("tiny")[1]
    "'tiny' is a random test model built in code: llama.cpp cannot load it"
    """
    if name.endswith(".gguf"):
        return name, ""
    if name.lower() == SMOLLM2_ALIAS:
        try:
            folder, file = smollm2_gguf()
        except (FileNotFoundError, ModuleNotFoundError) as err:
            return None, f"the bundled SmolLM2 GGUF is not installed here ({err})"
        return str(folder / file), ("the bundled SmolLM2-135M-Instruct Q4_1 GGUF mdboost converted and ranked "
                                    "(the same weights, computed on the quantized blocks)")
    if name.startswith("tiny"):
        return None, f"{name!r} is a random test model built in code: llama.cpp cannot load it"
    return None, (f"{name!r} is not a GGUF file and llama.cpp loads nothing else: convert it with llama.cpp's "
                  f"convert_hf_to_gguf.py")


_NO_GGUF = {"tuned": "an early exit with a tuned-lens translator (a layer llama.cpp's graph does not have)",
            "int8": "torch's dynamic int8 CPU copy of the target (llama.cpp's own lower-bit target is quant:<TYPE>)"}


def llamacpp_cannot(spec: str) -> str | None:
    """Why mdboost's loop cannot run the pool drafter ``spec`` with llama.cpp doing the forward
    passes, or None where it can: prompt lookup (``ngram:N``), ``early_exit:N`` (a truncated
    GGUF, :func:`gguf_drafter`) and a GGUF file run; ``tuned:N``, ``int8`` and other models do not.

    >>> llamacpp_cannot("early_exit:12") is None, llamacpp_cannot("ngram:3") is None
    (True, True)
    >>> llamacpp_cannot("int8")
    "torch's dynamic int8 CPU copy of the target (llama.cpp's own lower-bit target is quant:<TYPE>)"
    """
    kind, _ = parse_drafter(spec)
    if kind in ("ngram", "early_exit"):
        return None
    if kind in _NO_GGUF:
        return _NO_GGUF[kind]
    path, note = llamacpp_model(spec)
    return None if path is not None else note


def _block(name: str) -> int | None:
    """The block index of a tensor named ``blk.<i>.*``, None for the others."""
    match = re.match(r"blk\.(\d+)\.", name)
    return None if match is None else int(match.group(1))


def truncated_gguf(source: str | os.PathLike, num_layers: int, dest: str | os.PathLike) -> Path:
    """Write the first ``num_layers`` blocks of the GGUF ``source`` (with the embedding, final norm
    and head) to ``dest`` as a model of its own.

    Parameters
    ----------
    source : path-like
        A GGUF file of a decoder with ``<arch>.block_count`` blocks named ``blk.<i>.*``.
    num_layers : int
        Blocks kept, in ``[1, block_count - 1]``.
    dest : path-like
        The file written (atomically: a temporary name renamed into place).

    Returns
    -------
    pathlib.Path
        ``dest``.
    """
    import gguf  # deferred: only writing GGUF files needs it, importing mdboost.models does not

    reader = gguf.GGUFReader(str(source))
    arch = str(reader.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    count_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    total = int(reader.get_field(count_key).contents())
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers < total:
        raise ValueError(f"num_layers must be an int in [1, {total - 1}] for {source} ({total} blocks), got {num_layers!r}")
    kept = [t for t in reader.tensors if (_block(t.name) is None or _block(t.name) < num_layers)]
    with atomic_path(dest) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch=arch, endianess=reader.endianess)
        for field in reader.fields.values():
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue  # written by GGUFWriter itself
            value = num_layers if field.name == count_key else field.contents()
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, value, kind, sub_type=sub)
        for t in kept:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in kept:
            writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        writer.close()
    return Path(dest)


def quantized_gguf(source: str | os.PathLike, quantization: str, dest: str | os.PathLike, *,
                   n_threads: int = 1) -> Path:
    """Requantize the GGUF ``source`` to ``quantization`` with llama.cpp's ``llama_model_quantize``.

    Parameters
    ----------
    source : path-like
        A GGUF file (already quantized is fine: ``allow_requantize`` is set, as ``llama-quantize
        --allow-requantize`` does).
    quantization : str
        A key of :data:`QUANTIZATIONS`, e.g. ``"Q3_K_S"``.
    dest : path-like
        The file written (atomically).
    n_threads : int, default=1
        Threads llama.cpp quantizes with.

    Returns
    -------
    pathlib.Path
        ``dest``.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {sorted(QUANTIZATIONS)}, got {quantization!r}")
    llama_cpp = import_llama_cpp("quantizing a GGUF drafter")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANTIZATIONS[quantization]
    params.allow_requantize = True
    params.nthread = int(n_threads)
    with atomic_path(dest) as tmp:
        status = llama_cpp.llama_model_quantize(os.fsencode(source), os.fsencode(tmp), params)
        if status != 0:
            raise RuntimeError(f"llama_model_quantize({source}, {quantization}) failed with status {status}")
    return Path(dest)


def parse_gguf_drafter(spec: str) -> tuple[str, int | str]:
    """``"early_exit:12"`` -> ``("early_exit", 12)``; ``"quant:Q3_K_S"`` -> ``("quant", "Q3_K_S")``.

    >>> parse_gguf_drafter("early_exit:12"), parse_gguf_drafter("quant:Q2_K")
    (('early_exit', 12), ('quant', 'Q2_K'))
    """
    match = re.fullmatch(r"early_exit:(\d+)|quant:(\w+)", spec) if isinstance(spec, str) else None
    if match is None or (match.group(2) is not None and match.group(2) not in QUANTIZATIONS):
        raise ValueError(f"a GGUF drafter spec is early_exit:N or quant:<TYPE> with TYPE one of "
                         f"{sorted(QUANTIZATIONS)}, got {spec!r}")
    return ("early_exit", int(match.group(1))) if match.group(1) is not None else ("quant", match.group(2))


def gguf_drafter(target: str | os.PathLike, spec: str, home: str | os.PathLike | None = None) -> Path:
    """The GGUF file of the drafter ``spec`` (:func:`parse_gguf_drafter`) of the target GGUF
    ``target``, made once and kept under ``<home>/gguf/<target sha256>/`` (``home``:
    :func:`mdboost.models.home.mdboost_home`).

    A second process asking for the same file waits on a lock and reads the first one's; a file
    made from other bytes of ``target`` lives under another digest.
    """
    kind, arg = parse_gguf_drafter(spec)
    target = Path(target)
    if not target.is_file():
        raise FileNotFoundError(f"target must be a GGUF file, got {str(target)!r}")
    digest = sha256_file(target, memo=True)
    path = mdboost_home(home) / "gguf" / f"{digest[:32]}-v{FORMAT}" / f"{kind}-{arg}.gguf"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path(path)):
        if not path.is_file():
            if kind == "early_exit":
                truncated_gguf(target, arg, path)
            else:
                quantized_gguf(target, arg, path)
    return path
