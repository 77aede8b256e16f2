"""The pick's drafter written out as a checkpoint (``mdboost export --write-drafter DIR``), and the
command lines that load it in each engine."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from mdboost.export.servers import server_sampling
from mdboost.export.vllm import vllm_model
from mdboost.ranking.report import row_draft_p_min
from mdboost.serve_args import llamacpp_args, sglang_args, vllm_serve_args


VLLM_DRAFT_SAMPLING = {"sampled": "probabilistic", "greedy": "greedy"}  # vllm/config/speculative.py:99
GGUF_OUTTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}  # convert_hf_to_gguf.py --outtype


def write_pick_drafter(ranking: dict, out_dir: str | os.PathLike) -> dict:
    """Write the recommendation's drafter for its target to ``out_dir`` (:func:`mdboost.models.write.write_drafter`).

    The target is loaded on the CPU in the dtype the ranking ran it in (bfloat16 for a ranking on
    CUDA, float32 otherwise: :func:`mdboost.models.loading.default_dtype`), so the folder holds the
    weights the ranking drafted with. A drafter that cannot be written, or an existing
    ``out_dir``, is refused before the target is loaded.

    Returns
    -------
    dict with ``path``, ``drafter``, ``target``, ``gamma``, ``layers`` and ``dtype`` (from the
    folder's marker), ``engines`` (:func:`drafter_engine_lines`) and ``notes``.
    """
    import torch  # deferred: torch, transformers and the models load only when a drafter is written
    from mdboost.models.loading import default_dtype, load_model
    from mdboost.models.write import MARKER, unwritable_reason, write_drafter

    if not isinstance(ranking, dict) or "recommendation" not in ranking:
        raise TypeError(f"ranking must be the dict returned by load_ranking, got {type(ranking).__name__}")
    rec, home = ranking["recommendation"], ranking.get("home")
    why = unwritable_reason(rec["drafter"])
    if why is not None:
        raise ValueError(why)
    if not isinstance(out_dir, (str, os.PathLike)) or not os.fspath(out_dir):
        raise ValueError(f"out_dir must be the path of a new folder, got {out_dir!r}")
    if Path(out_dir).exists():
        raise FileExistsError(f"{os.fspath(out_dir)!r} already exists: give a new folder (nothing is overwritten)")
    dtype = default_dtype(torch.device(str(ranking["device"])))
    target, tokenizer = load_model(rec["target"], device="cpu", dtype=dtype, home=home)
    path = write_drafter(target, rec["drafter"], out_dir, tokenizer=tokenizer, home=home)
    marker = json.loads((path / MARKER).read_text())
    info = {"path": str(path.resolve()), "drafter": rec["drafter"], "target": rec["target"],
            "gamma": int(rec["gamma"]), "layers": marker["num_hidden_layers"], "dtype": marker["dtype"]}
    served, served_note = vllm_model(rec["target"], home)
    notes = [] if served is not None else [served_note]
    notes.append("these lines load the drafter; which verification rule each engine runs and whether it can run the "
                 "pick's budget: `mdboost export --format json`")
    if not rec["beats_plain_decoding"]:
        notes.insert(0, "the ranking predicts plain decoding to be as fast as this pick: serving without a drafter "
                        "may be as fast")
    return {**info, "engines": drafter_engine_lines(info, rec, home, ranking.get("sampling")), "notes": notes}


def drafter_engine_lines(written: dict, rec: dict, home: str | None = None, sampling: dict | None = None) -> dict:
    """The command lines that load a written drafter folder, per engine.

    - ``vllm``: ``speculative_config`` with ``method: draft_model``, ``model: <folder>``,
      ``num_speculative_tokens: gamma`` and ``draft_sample_method`` as the ranking drafted
      (``probabilistic`` for sampled drafts; vLLM's default is ``greedy``), fields of vLLM 0.34's
      ``SpeculativeConfig`` (``vllm/config/speculative.py:455-461, 682``);
    - ``sglang``: ``--speculative-algorithm STANDALONE --speculative-draft-model-path <folder>``
      with ``gamma`` steps, top-k 1 and ``gamma + 1`` draft tokens (SGLang 0.5.23
      ``srt/arg_groups/fields/spec.py:31-69``; top-k 1 needs ``num_steps + 1`` tokens,
      ``srt/arg_groups/speculative_hook.py:1255-1262``);
    - ``llamacpp``: ``convert_hf_to_gguf.py`` (llama.cpp's converter, ``--outtype`` the folder's
      dtype, so no rounding) then ``llama-server -md <gguf> --spec-type draft-simple
      --spec-draft-n-max gamma`` (``common/arg.cpp:4140, 4241, 4249`` of the llama.cpp vendored in
      llama-cpp-python 0.3.36; the default speculative type is ``none``, ``common/common.h:373``).
    """
    path, gamma = written["path"], int(written["gamma"])
    target = vllm_model(rec["target"], home)[0] or "<target>"
    drafting = rec.get("drafting") or "sampled"  # mdboost's ranking samples drafts from p
    if drafting not in VLLM_DRAFT_SAMPLING:
        raise ValueError(f"the recommendation's drafting must be one of {tuple(VLLM_DRAFT_SAMPLING)}, got {drafting!r}")
    config = {"method": "draft_model", "model": path, "num_speculative_tokens": gamma,
              "draft_sample_method": VLLM_DRAFT_SAMPLING[drafting]}
    sampling = server_sampling(rec, sampling or {})
    gguf = f"{path}.gguf"
    served = {k: v for k, v in sampling.items() if v is not None}
    return {"vllm": {"speculative_config": config, "serve": shlex.join(vllm_serve_args(target, served, config))},
            "sglang": {"launch_server": shlex.join(sglang_args(target, draft_model=path, num_draft_tokens=gamma,
                                                               **sampling))},
            "llamacpp": {"convert": f"python convert_hf_to_gguf.py {path} --outfile {gguf} "
                                    f"--outtype {GGUF_OUTTYPES.get(written['dtype'], 'auto')}",
                         "llama_server": shlex.join(llamacpp_args("<target GGUF>", draft_model=gguf, draft_max=gamma,
                                                                  draft_p_min=row_draft_p_min(rec),
                                                                  **sampling))}}


def render_written(written: dict) -> str:
    """The lines ``mdboost export --write-drafter`` prints for :func:`write_pick_drafter`'s result."""
    engines = written["engines"]
    return "\n".join([
        f"wrote drafter {written['drafter']} of {written['target']} ({written['layers']} layers, {written['dtype']}) "
        f"to {written['path']}",
        f"vLLM:      {engines['vllm']['serve']}",
        f"SGLang:    {engines['sglang']['launch_server']}",
        f"llama.cpp: {engines['llamacpp']['convert']}",
        f"           {engines['llamacpp']['llama_server']}",
        *(f"note: {note}" for note in written["notes"])])
