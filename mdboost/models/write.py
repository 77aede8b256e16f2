"""Write a drafter out as a standalone transformers checkpoint, for engines that load a draft model.

vLLM (``speculative_config={"method": "draft_model", "model": DIR}``), SGLang
(``--speculative-draft-model-path DIR``) and llama.cpp (``-md`` on the folder converted to GGUF)
load a drafter from a folder. :func:`write_drafter` writes the folder for the drafter kinds that
are a standard checkpoint of some architecture, with exactly the weights mdboost drafts with:

- ``early_exit:N``: :func:`mdboost.models.drafters.early_exit_model` is the target's own class
  with ``num_hidden_layers = N`` holding the target's embedding table, first ``N`` decoder layers,
  final norm and LM head (the same modules, nothing else). Saving that model gives a config with
  ``num_hidden_layers = N`` and the kept tensors; loading it back computes the same logits.
- a model drafter (a name or path): the model itself, as :func:`mdboost.models.load_model` loads it.

Kinds that are no standard checkpoint raise a ``ValueError`` naming the spec and saying what to
use instead: ``tuned:N`` (a fitted affine map before the final norm, a layer the architecture
has not), ``int8`` (torch's dynamic quantization, which neither transformers saves nor an engine
loads) and ``ngram:N`` (prompt lookup: no model; engines have their own n-gram drafting).

The folder is written atomically (:func:`mdboost._io.atomic_folder`): a failure midway leaves no
folder at all, and an existing folder is never overwritten.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from mdboost import __version__
from mdboost._io import atomic_folder

from .drafters import early_exit_model
from .loading import load_model
from .specs import parse_drafter

MARKER = "mdboost_drafter.json"  # what the folder holds: the spec, its target, mdboost's version
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")


def unwritable_reason(spec: str, architecture: str = "the target's architecture") -> str | None:
    """Why the drafter ``spec`` cannot be written as a checkpoint engines load, or None when it can.

    >>> unwritable_reason("early_exit:3") is None
    True
    >>> unwritable_reason("ngram:3").startswith("drafter 'ngram:3' is prompt lookup")
    True
    """
    kind, n = parse_drafter(spec)
    if kind == "ngram":
        return (f"drafter {spec!r} is prompt lookup, not a model: nothing to write; serve it with the engine's own "
                f"n-gram drafting: vLLM speculative_config {{'method': 'ngram', 'prompt_lookup_max': {n}, "
                f"'prompt_lookup_min': 1}} (`mdboost export --format vllm`); SGLang's --speculative-algorithm NGRAM "
                f"and llama.cpp's --spec-type ngram-simple follow their own lookup rules")
    if kind == "tuned":
        return (f"drafter {spec!r} cannot be written as a checkpoint engines load: it applies a fitted affine map "
                f"(hidden -> hidden, with bias) before the final norm, a layer {architecture} does not have; "
                f"early_exit:{n} is the same layers without it (another distribution, ranked in its own rows): "
                f"write that instead")
    if kind == "int8":
        return (f"drafter {spec!r} cannot be written: it is torch's dynamic quantization (int8 weights with one "
                f"scale per tensor, activations quantized with one scale per forward), which transformers does not "
                f"save and no engine loads; the engines' int8 formats (vLLM / SGLang: a W8A8-INT8 compressed-tensors "
                f"checkpoint; llama.cpp: a Q8_0 GGUF, convert_hf_to_gguf.py --outtype q8_0) quantize otherwise: "
                f"make one with that tool and rank it as a model drafter (its path in pool.drafters)")
    return None


def write_drafter(target_model, spec: str, out_dir: str | os.PathLike, *, tokenizer=None,
                  home: str | os.PathLike | None = None) -> Path:
    """Write the drafter ``spec`` of ``target_model`` to ``out_dir`` as a transformers checkpoint.

    Parameters
    ----------
    target_model : transformers causal LM
        The target, in the dtype the drafter should be written in (its tensors are saved as they are).
    spec : str
        ``"early_exit:N"`` (``1 <= N < L``) or a model name or path (see the module docstring);
        ``tuned:N``, ``int8`` and ``ngram:N`` are a ValueError saying what to use instead.
    out_dir : path
        A folder that does not exist yet (``FileExistsError`` otherwise); written atomically.
    tokenizer : tokenizer or None
        Saved next to the weights of an ``early_exit`` drafter (None: the tokenizer files of the
        target's folder are copied when ``target_model.name_or_path`` is one; else none are written).
        A model drafter is written with its own tokenizer.
    home : path or None
        The mdboost home a model drafter's name resolves in (:func:`mdboost.models.load_model`).

    Returns
    -------
    Path
        ``out_dir``, holding ``config.json``, the safetensors weights, the tokenizer files and
        ``mdboost_drafter.json`` (the spec, the target's name, mdboost's version).
    """
    if not isinstance(out_dir, (str, os.PathLike)) or not os.fspath(out_dir):
        raise ValueError(f"out_dir must be the path of a new folder, got {out_dir!r}")
    architecture = type(target_model).__name__
    why = unwritable_reason(spec, architecture)
    if why is not None:
        raise ValueError(why)
    kind, n = parse_drafter(spec)
    if kind == "early_exit":
        try:
            draft = early_exit_model(target_model, n)
        except ValueError as err:  # the depth: "num_layers must be an integer in [1, L - 1] ..."
            raise ValueError(f"drafter {spec!r}: {err}") from None
    else:  # a model drafter: written as load_model gives it, in the target's dtype
        draft, tokenizer = load_model(spec, device="cpu", dtype=next(target_model.parameters()).dtype, home=home)
    out_dir = Path(out_dir)
    with atomic_folder(out_dir) as tmp:
        draft.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        else:
            _copy_tokenizer_files(getattr(target_model, "name_or_path", ""), tmp)
        marker = {"drafter": spec, "target": str(getattr(target_model, "name_or_path", "") or ""),
                  "architecture": type(draft).__name__, "num_hidden_layers": draft.config.num_hidden_layers,
                  "dtype": str(next(draft.parameters()).dtype).replace("torch.", ""), "mdboost": __version__}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2))
    return out_dir


def _copy_tokenizer_files(source: str, out_dir: Path) -> list[str]:
    """Copy the tokenizer files of the folder ``source`` (if it is one) into ``out_dir``; their names."""
    folder = Path(source).expanduser() if source else None
    if folder is None or not folder.is_dir():
        return []
    copied = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    for name in copied:
        shutil.copyfile(folder / name, out_dir / name)
    return copied
