"""vLLM's section: the lossless ``speculative_config`` of a pick, the model vLLM loads, the
``vllm serve`` line, the nearest lossless option of a lossy pick, and the per-batch-size draft
lengths (the module docstring of :mod:`mdboost.export`)."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from mdboost.export.snippets import MAX_NEW_TOKENS, PROMPT
from mdboost.models.home import models_dir
from mdboost.models.specs import parse_drafter
from mdboost.ranking.report import csv_bool, row_batch_size, row_draft_p_min
from mdboost.serve_args import vllm_serve_args

VLLM_METHODS = ("draft_model", "ngram")
SPECULATIVE_CONFIG_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                           "draft_sample_method", "rejection_sample_method")
DRAFTINGS = {"sampled": "probabilistic", "greedy": "greedy"}  # a rule's drafting -> vLLM's draft_sample_method


def written_drafter_path(target: str, drafter: str, home: str | None = None) -> str:
    """Where ``mdboost export --write-drafter`` should write ``drafter`` of ``target`` for the
    engines to load it (the ranking's mdboost home's models folder).

    >>> Path(written_drafter_path("smollm2-135m", "early_exit:12", "/h")).name
    'smollm2-135m--early_exit_12'
    """
    return str(models_dir(home) / f"{target}--{drafter.replace(':', '_')}")


def _written_note(target: str, drafter: str, home: str | None) -> str:
    return (f"the drafter {drafter!r} is an early exit mdboost builds from the target: write it out first, "
            f"`mdboost export --ranking <this ranking> --write-drafter {written_drafter_path(target, drafter, home)}` "
            f"(a standalone model drafts on its own KV cache, where mdboost's engine shared the target's: its cost "
            f"differs from the ranked one)")


def speculative_config(drafter: str, gamma: int, home: str | None = None,
                       drafting: str = "sampled", target: str | None = None) -> tuple[dict | None, str]:
    """vLLM's lossless ``speculative_config`` for an mdboost drafter spec, or ``None`` and why not.

    ``drafting``: how the ranked rule drew its drafts, ``"sampled"`` from the drafter or
    ``"greedy"`` (its argmax): a draft model's ``draft_sample_method`` (``"probabilistic"`` or
    ``"greedy"``, vLLM's default; ``vllm/config/speculative.py:682``). An n-gram draft is one
    deterministic token in both engines: vLLM's n-gram speculator keeps no draft logits
    (``BaseSpeculator.draft_logits = None``, ``vllm/v1/worker/gpu/spec_decode/speculator.py:83``),
    so it is verified as one-hot whatever ``draft_sample_method`` says, as mdboost ranks it. An
    early exit of ``target`` runs as the folder ``mdboost export --write-drafter`` writes
    (:func:`written_drafter_path`); without ``target`` it has none.

    >>> speculative_config("ngram:3", 4)[0]  # doctest: +NORMALIZE_WHITESPACE
    {'method': 'ngram', 'num_speculative_tokens': 4, 'prompt_lookup_max': 3, 'prompt_lookup_min': 1,
     'rejection_sample_method': 'standard'}
    >>> speculative_config("tuned:12", 4)[0] is None
    True
    """
    if drafting not in DRAFTINGS:
        raise ValueError(f"drafting must be one of {tuple(DRAFTINGS)}, got {drafting!r}")
    kind, n = parse_drafter(drafter)
    if kind == "ngram":  # mdboost's prompt lookup falls back from n-token suffixes down to one token
        return {"method": "ngram", "num_speculative_tokens": int(gamma), "prompt_lookup_max": n,
                "prompt_lookup_min": 1, "rejection_sample_method": "standard"}, ""
    if kind == "early_exit" and target is not None and vllm_model(target, home)[0] is not None:
        return {"method": "draft_model", "model": written_drafter_path(target, drafter, home),
                "num_speculative_tokens": int(gamma), "draft_sample_method": DRAFTINGS[drafting],
                "rejection_sample_method": "standard"}, _written_note(target, drafter, home)
    if kind == "hf":  # an mdboost alias (smollm2-135m, tiny:<seed>) maps to what vLLM can load, or to nothing
        model, note = vllm_model(drafter, home)
        if model is None:
            return None, f"drafter: {note}"
        return {"method": "draft_model", "model": model, "num_speculative_tokens": int(gamma),
                "draft_sample_method": DRAFTINGS[drafting], "rejection_sample_method": "standard"}, ""
    what = {"early_exit": "an early exit of the target (its first layers)",
            "tuned": "an early exit with a tuned-lens translator", "int8": "a dynamically int8-quantized CPU copy"}
    return None, f"vLLM has no drafter method for {drafter!r} ({what[kind]} built by mdboost)"


def vllm_model(target: str, home: str | None = None) -> tuple[str | None, str]:
    """The model vLLM should load for an mdboost target name, and a note; ``home``: the mdboost
    home of the ranking (None: the default one).

    A ``.gguf`` file has none: vLLM 0.34.0 has no ``"gguf"`` load format
    (``vllm/model_executor/model_loader/__init__.py:33-66``), its default loader reads
    ``*.safetensors`` / ``*.bin`` / ``*.pt`` only (``default_loader.py:187-206``), and a model
    path needs a ``config.json`` (``vllm/transformers_utils/config.py:934-968``): the note says
    how to convert it to a folder vLLM loads.

    >>> vllm_model("/m/q4.gguf")[0] is None
    True
    """
    if target.lower() == "smollm2-135m":
        return str(models_dir(home) / "smollm2-135m"), ("mdboost's conversion of the bundled SmolLM2-135M-Instruct "
                                                    "Q4_1 GGUF (made by `mdboost rank`)")
    if target.startswith("tiny"):
        return None, f"{target!r} is a random test model built in code: vLLM cannot load it"
    if target.endswith(".gguf"):
        path = Path(target).expanduser()
        return None, (f"{target!r} is a GGUF file, which vLLM 0.34.0 cannot load (no gguf load format; it reads "
                      f"a folder with config.json and safetensors/bin weights): convert it once with "
                      f"`python -c \"from mdboost.models.convert import convert_gguf; "
                      f"convert_gguf('{path.parent}', '{path.name}', '{path.with_suffix('')}')\"` and give vLLM "
                      f"the folder {str(path.with_suffix(''))!r}")
    return target, ""


def _drafting_note(config: dict) -> str:
    """The draft sampling of an emitted config, and why (``vllm/config/speculative.py:682``)."""
    if config["method"] == "ngram":
        return "; n-gram drafts are one deterministic token, verified as one-hot, as ranked"
    if config.get("draft_sample_method") == "greedy":
        return ("; draft_sample_method 'greedy' (vLLM's default): the drafter's argmax, verified as one-hot, as "
                "ranked")
    return ("; draft_sample_method 'probabilistic': drafts sampled from the drafter, as ranked (vLLM's default "
            "'greedy' drafts the argmax and accepts it with probability q(x): another acceptance, another speedup)")


def _served(out: dict, config: dict | None) -> dict:
    """The vllm section with its ``serve`` argv: sampling as ranked (not the model's generation_config)."""
    if out["model"] is not None:
        out["serve"] = vllm_serve_args(out["model"], out["sampling_params"], config)
        out["notes"].append("the server's sampling defaults are the ranked ones: --generation-config vllm (not the "
                            "model's generation_config.json, vllm/config/model.py:1899-1904) and "
                            "--override-generation-config; a request's own temperature/top_k/top_p still win")
    return out


def _vllm(rec: dict, rows: list[dict], sampling: dict, home: str | None = None, batch_rows=None) -> dict:
    out = _vllm_point(rec, rows, sampling, home, batch_rows)
    config = out["speculative_config"] or (out["nearest_lossless"] or {}).get("speculative_config")
    return _served(out, config)


def _vllm_point(rec: dict, rows: list[dict], sampling: dict, home: str | None = None, batch_rows=None) -> dict:
    model, model_note = vllm_model(rec["target"], home)
    params = {"temperature": float(rec["temperature"])}
    params.update({k: v for k, v in sampling.items() if v is not None})
    notes = [model_note] if model_note else []
    out = {"model": model, "sampling_params": params, "lossless": float(rec["max_divergence"]) == 0,
           "speculative_config": None, "nearest_lossless": None, "serve": None, "notes": notes}
    if not rec["beats_plain_decoding"]:
        lo = rec.get("predicted_speedup_lo")
        if lo is not None and not math.isfinite(float(lo)):  # as Recommendation.verdict says it
            notes.append("no interval, so no point is called faster than plain decoding (ranking.resamples: 0 "
                         "computes none): serve the target without speculative_config")
        else:
            notes.append("no drafter is reliably faster here: serve the target without speculative_config")
        return out
    config, why = speculative_config(rec["drafter"], rec["gamma"], home, drafting=rec.get("drafting") or "sampled",
                                     target=rec["target"])
    if out["lossless"] and config is not None:
        if why:  # an early exit: write it out first
            notes.append(why)
        block = rec.get("rule") == "block"
        if block:  # vLLM's block verification (rejection_sampler.py:182-183), ranked as mdboost.md.rules.Block
            config["rejection_sample_method"] = "block"
        out["speculative_config"] = config
        schedule = batch_size_schedule(batch_rows or [], rec)
        if schedule is not None:
            config["num_speculative_tokens_per_batch_size"] = schedule
            config["num_speculative_tokens"] = max(config["num_speculative_tokens"], *(k for _, _, k in schedule))
            notes.append(f"num_speculative_tokens_per_batch_size {schedule}: the point's best draft length at each "
                         f"ranked batch size (0: plain decoding predicted faster there), each from its batch size to "
                         f"the next one's (vllm/config/speculative.py:570, vllm/v1/spec_decode/dynamic/utils.py)")
        method = "block verification (Sun et al. 2024)" if block else "standard rejection sampler"
        notes.append(f"lossless speculative decoding: vLLM's {method} keeps the target's distribution, as the "
                     f"ranked rule does" + _drafting_note(config))
    else:
        if not out["lossless"]:
            notes.append(f"vLLM 0.34.0 has no budgeted (divergence-bounded) verification: its "
                         f"rejection_sample_method is 'standard' or 'block' (lossless), 'fly' (lossy, gated by the "
                         f"target's entropy, no divergence bound) or 'synthetic' (fixed acceptance rates, for "
                         f"benchmarks), so the pick's mentored-decoding budget "
                         f"({rec['divergence']} <= {float(rec['max_divergence']):g}) cannot run there")
        if why:
            notes.append(why)
        near = out["nearest_lossless"] = nearest_lossless(rows, rec, home)
        if near is None:
            notes.append("the ranking has no budget-0 point with a drafter vLLM can run: serve the target "
                         "without speculative_config")
        else:
            verdict = ("predicted to beat plain decoding" if near["beats_plain_decoding"] else
                       "NOT predicted to beat plain decoding (serving without speculative_config may be as fast)")
            notes.append(f"nearest lossless option: {near['drafter']} -> {near['target']}, T={near['temperature']:g}, "
                         f"SD, gamma {near['gamma']} (rank {near['rank']}): predicted {near['predicted_speedup']:.2f}x "
                         f"[{near['predicted_speedup_lo']:.2f}, {near['predicted_speedup_hi']:.2f}] in mdboost's "
                         f"engine, {verdict}")
    return out


def batch_size_schedule(rows: list[dict], rec: dict) -> list[list[int]] | None:
    """vLLM's ``num_speculative_tokens_per_batch_size`` for a lossless pick: per ranked batch size
    the point's best draft length there, 0 where plain decoding is predicted faster (its predicted
    speedup at that batch size <= 1), as inclusive ranges ``[start, end, K]`` from each ranked
    batch size to the next one's start - 1 (vLLM 0.34.0 carries the last range's ``K`` on to its
    ``max_num_seqs``: ``vllm/v1/spec_decode/dynamic/utils.py:85-148``; the first range must start
    at 1, ``utils.py:67-72``). None with a single batch size ranked (no schedule to give).

    >>> rows = [{"drafter": "d", "target": "t", "temperature": "1.0", "max_divergence": "0.0", "rule": "mentored",
    ...          "drafting": "sampled", "draft_p_min": "0.0", "is_best_gamma": "True", "gamma": g, "batch_size": b,
    ...          "predicted_speedup": s} for b, g, s in (("1", "5", "1.4"), ("4", "2", "1.1"), ("8", "1", "0.9"))]
    >>> batch_size_schedule(rows, {"drafter": "d", "target": "t", "temperature": 1.0, "max_divergence": 0.0})
    [[1, 3, 5], [4, 7, 2], [8, 8, 0]]
    """
    def same(r):
        return (str(r["drafter"]), str(r["target"]), float(r["temperature"]), float(r["max_divergence"]),
                str(r.get("rule") or "mentored"), str(r.get("drafting") or "sampled"), row_draft_p_min(r)) == (
            str(rec["drafter"]), str(rec["target"]), float(rec["temperature"]), float(rec["max_divergence"]),
            str(rec.get("rule") or "mentored"), str(rec.get("drafting") or "sampled"), float(rec.get("draft_p_min") or 0))

    best = {}
    for r in rows:
        if same(r) and csv_bool(r.get("is_best_gamma")):
            best[row_batch_size(r)] = 0 if float(r["predicted_speedup"]) <= 1 else int(float(r["gamma"]))
    sizes = sorted(best)
    if len(sizes) < 2 or sizes[0] != 1:
        return None
    ends = [b - 1 for b in sizes[1:]] + [sizes[-1]]
    return [[b, e, best[b]] for b, e in zip(sizes, ends)]


def nearest_lossless(rows: list[dict], rec: dict, home: str | None = None) -> dict | None:
    """The best-ranked budget-0 row at the pick's temperature whose drafter vLLM can run
    (the pick's own drafter first), with its ``speculative_config``; ``None`` if there is none.
    ``home``: the ranking's mdboost home (:func:`vllm_model`)."""
    temperature = float(rec["temperature"])
    candidates = []
    for row in rows:
        if float(row["max_divergence"]) != 0 or float(row["temperature"]) != temperature:
            continue
        config = speculative_config(row["drafter"], int(float(row["gamma"])), home)[0]
        if config is not None:
            candidates.append((row["drafter"] != rec["drafter"], int(float(row["rank"])), row, config))
    if not candidates:
        return None
    _, rank, row, config = min(candidates, key=lambda c: c[:2])
    speedup = {k: float(row[k]) for k in ("predicted_speedup", "predicted_speedup_lo", "predicted_speedup_hi")}
    return {"drafter": row["drafter"], "target": row["target"], "temperature": temperature,
            "gamma": int(float(row["gamma"])), "rank": rank, **speedup,
            "beats_plain_decoding": speedup["predicted_speedup_lo"] > 1, "speculative_config": config}


def vllm_snippet(vllm: dict) -> str:
    """Python (and the ``vllm serve`` line) for the ``vllm`` section, or its note when vLLM cannot run it."""
    config = vllm["speculative_config"]
    lines = [f"# {note}" for note in vllm["notes"]]
    if config is None and vllm["nearest_lossless"] is not None:
        config = vllm["nearest_lossless"]["speculative_config"]
    if vllm["model"] is None:
        return "\n".join(lines)
    params = ", ".join(f"{k}={v!r}" for k, v in vllm["sampling_params"].items())
    spec = "" if config is None else f", speculative_config={config!r}"
    # an explicit SamplingParams: LLM.generate applies no generation_config defaults (vllm/entrypoints/llm.py:479-480)
    return "\n".join(lines + ["from vllm import LLM, SamplingParams", "",
                              f"llm = LLM(model={vllm['model']!r}{spec})",
                              f"outputs = llm.generate([{PROMPT!r}], "
                              f"SamplingParams({params}, max_tokens={MAX_NEW_TOKENS}))",
                              f"# server: {shlex.join(vllm['serve'])}"])
