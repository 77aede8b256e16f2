"""What to run for a ranking's recommendation: mdboost's engine, Hugging Face ``generate``, vLLM,
SGLang, llama.cpp.

:func:`load_ranking` reads a ranking (an output folder of ``mdboost rank``, or its MLflow run);
:func:`export_plan` turns its recommendation into one JSON-able document:

- ``mdboost``: the :func:`mdboost.engine.generate` call;
- ``hf``: the ``target.generate(custom_generate=mdboost.hf.mentored_generate, ...)`` call and
  its keyword arguments;
- ``vllm``: the target and sampling parameters, the ``vllm serve`` line, and for a lossless
  (budget 0) pick whose drafter vLLM can run, its ``speculative_config`` (fields of vLLM
  0.34.0's ``SpeculativeConfig``, ``vllm/config/speculative.py``: ``method``, ``model``,
  ``num_speculative_tokens``, ``prompt_lookup_max``, ``prompt_lookup_min``,
  ``draft_sample_method``, ``rejection_sample_method``). The ranking drafts by sampling from
  the drafter, vLLM by default greedily (``draft_sample_method: "greedy"``, line 682): a draft
  model's pick is exported with ``"probabilistic"`` drafts and ``"standard"`` rejection, what was
  ranked. vLLM has no budgeted (divergence-bounded) verification: its
  ``rejection_sample_method`` (line 98) is ``"standard"`` or ``"block"`` (lossless),
  ``"fly"`` (lossy, gated by the target's entropy, with no divergence bound) or
  ``"synthetic"`` (fixed acceptance rates, for benchmarks). So a lossy (MD) pick has no
  ``speculative_config``: the document says so and names the nearest lossless option of the
  ranking instead (``docs/theory.md`` section 3: budget 0 is standard SD). vLLM 0.34.0 loads
  no GGUF file (see :func:`vllm_model`).
- ``sglang`` and ``llamacpp``: ``launch_server`` / ``llama-server`` arguments
  (:mod:`mdboost.serve_args`) for the pick's drafter and draft length, verified losslessly
  (SGLang's thresholds ``c = s = 1``), or a note saying why the engine cannot run that drafter.

:func:`render` prints the document as JSON or as the Python of one of the three calls.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import tempfile
from pathlib import Path

from mdboost._io import json_ready, read_json_object, read_yaml_mapping
from mdboost.models.gguf_drafters import llamacpp_model
from mdboost.models.home import mdboost_home, models_dir
from mdboost.models.specs import parse_drafter
from mdboost.ranking.recommend import md_row
from mdboost.ranking.report import (ALONE, at_batch_size, batch_sizes_of, check_csv_digest, csv_bool, read_csv,
                                    row_batch_size, row_draft_p_min)
from mdboost.ranking.summary_check import REQUIRED, check_recommendation, check_recommendations_in_rows, check_summary
from mdboost.serve_args import llamacpp_args, sglang_args, vllm_serve_args
from mdboost.tracking.store import check_tracking_uri, existing_run

FORMATS = ("json", "mdboost", "hf", "vllm", "sglang", "llamacpp")
VLLM_METHODS = ("draft_model", "ngram")
SPECULATIVE_CONFIG_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                           "draft_sample_method", "rejection_sample_method")
DRAFTINGS = {"sampled": "probabilistic", "greedy": "greedy"}  # a rule's drafting -> vLLM's draft_sample_method
PROMPT = "def fib(n):"
MAX_NEW_TOKENS = 64
_RUN_ID = re.compile(r"[0-9a-f]{32}")


def _bool_param(text: str) -> bool:
    """``"True"`` / ``"False"`` (how MLflow params hold a bool), else ValueError."""
    if text not in ("True", "False"):
        raise ValueError(text)
    return text == "True"

_RECOMMENDATION_TYPES = {"temperature": float, "max_divergence": float, "gamma": int, "predicted_speedup": float,
                         "predicted_speedup_lo": float, "predicted_speedup_hi": float, "nll_target": float,
                         "nll_mentored": float, "beats_plain_decoding": _bool_param, "quality_ok": _bool_param,
                         "draft_p_min": float, "threshold_acc": float, "threshold_single": float}


def load_ranking(source: str | os.PathLike, *, tracking_uri: str | None = None) -> dict:
    """The recommendation, sampling settings, rows, device and mdboost home of a ranking.

    Parameters
    ----------
    source : str or os.PathLike
        An output folder of ``mdboost rank`` (``summary.json`` and ``ranking.csv``), or the
        32-hex-digit id of its MLflow parent run (artifacts ``ranking.csv``, and
        ``summary.json`` or the run's ``recommendation.*`` parameters).
    tracking_uri : str or None
        The MLflow store of a run id (``None``: MLflow's own default resolution).

    Returns
    -------
    dict with ``recommendation``, ``sampling`` (``top_k``, ``top_p``), ``rows``, ``device``,
    ``home`` (the folder of the ranking's converted models and tuned translators when its config
    named one, ``pool.home``; None: the default home of whoever runs the snippets), ``source``
    and ``speed_engine`` (whose steps its costs timed, the config's ``speed.engine``: ``mdboost``
    or ``llamacpp``).
    """
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise TypeError(f"source must be a ranking folder (str or os.PathLike) or an MLflow run id (str), "
                        f"got {type(source).__name__} {source!r}")
    if not source:
        raise ValueError(f"ranking must be a ranking folder or an MLflow run id, got {source!r}")
    folder = Path(source)
    if folder.is_dir():
        summary = read_json_object(folder / "summary.json")
        if summary is None or "recommendation" not in summary:
            raise ValueError(f"ranking folder {source!r} has no summary.json with a recommendation: "
                             f"run `mdboost rank --config ...` first")
        return _from_summary(summary, folder, source)
    if _RUN_ID.fullmatch(source):
        return _from_run(source, tracking_uri)
    raise ValueError(f"ranking must be a ranking folder or an MLflow run id (32 hex digits), got {source!r}: "
                     "no such folder")


def _from_summary(summary: dict, folder: Path, source: str) -> dict:
    """The ranking of ``folder`` as its ``summary.json`` describes it, checked field by field
    (:func:`mdboost.ranking.summary_check.check_summary`) and its recommendations found in ``ranking.csv``."""
    where = f"ranking {source!r}"
    summary = check_summary(summary, where)
    out = _ranking(summary["recommendation"], summary.get("sampling") or {}, folder, source,
                   summary.get("ranking_csv_sha256"), summary.get("device"), summary.get("home"),
                   summary.get("recommendations"))
    check_recommendations_in_rows(summary, out["batch_rows"], where)
    return out


def _param_value(key: str, value: str, run_id: str):
    """A ``recommendation.*`` parameter of an MLflow run as its type (ValueError naming it)."""
    if value == "None" and key in ("threshold_acc", "threshold_single"):
        return None
    try:
        return _RECOMMENDATION_TYPES.get(key, str)(value)
    except ValueError:
        kind = "True or False" if _RECOMMENDATION_TYPES[key] is _bool_param else _RECOMMENDATION_TYPES[key].__name__
        raise ValueError(f"MLflow run {run_id!r}: parameter recommendation.{key} must be {kind}, got {value!r}") from None


# what export_plan reads of the recommendation, and of every ranking row (nearest_lossless)
_REC_KEYS = REQUIRED
_ROW_KEYS = ("drafter", "target", "temperature", "max_divergence", "gamma", "rank", "predicted_speedup",
             "predicted_speedup_lo", "predicted_speedup_hi")


def _checked(rec, rows: list[dict], source: str) -> None:
    if not isinstance(rec, dict):
        raise ValueError(f"ranking {source!r}: the recommendation must be a mapping, got {type(rec).__name__}")
    missing = [k for k in _REC_KEYS if k not in rec]
    if missing:
        raise ValueError(f"ranking {source!r}: the recommendation lacks {', '.join(missing)}")
    absent = [k for k in _ROW_KEYS if rows and k not in rows[0]]
    if absent:
        raise ValueError(f"ranking {source!r}: ranking.csv lacks the columns {', '.join(absent)}")


def _ranking(rec: dict, sampling: dict, folder: Path, source: str, csv_sha256: str | None = None,
             device: str | None = None, home: str | None = None, recommendations: dict | None = None) -> dict:
    """The ranking of ``folder``; ``csv_sha256``: the digest of ``ranking.csv`` its summary
    records (rankings from before it recorded one: None, not checked); ``device``: the one the
    ranking ran on, as its summary records it (older rankings: the config's ``pool.device``, else CPU);
    ``home``: the absolute mdboost home its summary records (older rankings: the config's
    ``pool.home``, resolved here; None where the config named none); ``recommendations``: its
    summary's best point per engine (rankings from before rules were ranked: None)."""
    csv = folder / "ranking.csv"
    if not csv.is_file():
        raise ValueError(f"ranking {source!r} has no ranking.csv")
    check_csv_digest(csv, csv_sha256, f"ranking {source!r}")
    every = read_csv(csv)
    rows = at_batch_size(every, batch_sizes_of(every)[0]) if every else every  # the headline batch size's
    _checked(rec, rows, source)
    config, configured, speed_engine = folder / "config.resolved.yaml", None, "mdboost"
    if config.is_file():
        resolved = read_yaml_mapping(config)
        pool, speed = resolved.get("pool"), resolved.get("speed")
        for name, section in (("pool", pool), ("speed", speed)):
            if section is not None and not isinstance(section, dict):
                raise ValueError(f"{config}: {name} must be a mapping, got {section!r}")
        configured = (pool or {}).get("device")
        speed_engine = (speed or {}).get("engine") or "mdboost"
        if home is None and (pool or {}).get("home") is not None:
            home = str(mdboost_home(pool["home"]))
    device = str(device) if device is not None else configured or "cpu"
    if not isinstance(sampling, dict):
        raise ValueError(f"ranking {source!r}: sampling must be a mapping, got {sampling!r}")
    return {"recommendation": dict(rec), "sampling": {"top_k": sampling.get("top_k"), "top_p": sampling.get("top_p")},
            "rows": rows, "device": device, "home": None if home is None else str(home), "source": source,
            "recommendations": recommendations, "batch_rows": every, "speed_engine": speed_engine}


def _from_run(run_id: str, tracking_uri: str | None) -> dict:
    import mlflow  # deferred: mlflow: seconds to import; only an MLflow run's ranking needs it
    from mlflow.exceptions import MlflowException

    uri = mlflow.get_tracking_uri() if tracking_uri is None else check_tracking_uri(tracking_uri)
    run = existing_run(run_id, uri)
    client = mlflow.MlflowClient(uri)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("ranking.csv", "config.resolved.yaml", "summary.json"):
            try:
                client.download_artifacts(run_id, name, tmp)
            except (MlflowException, OSError):
                pass  # optional files; ranking.csv is checked by _ranking
        summary = read_json_object(Path(tmp) / "summary.json")
        if summary is not None and "recommendation" in summary:
            return _from_summary(summary, Path(tmp), run_id)
        params = run.data.params
        rec = {k[len("recommendation."):]: v for k, v in params.items() if k.startswith("recommendation.")}
        if "drafter" not in rec:
            raise ValueError(f"MLflow run {run_id!r} is not a ranking run (no recommendation.* parameters)")
        rec = {k: _param_value(k, v, run_id) for k, v in rec.items()}
        check_recommendation(rec, f"MLflow run {run_id!r}")
        sampling = {k: None if params.get(f"md.{k}") in (None, "None") else float(params[f"md.{k}"])
                    for k in ("top_k", "top_p")}
        if sampling["top_k"] is not None:
            sampling["top_k"] = int(sampling["top_k"])
        return _ranking(rec, sampling, Path(tmp), run_id)


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


def _settings_args(rec: dict, sampling: dict) -> list[str]:
    args = [f"temperature={float(rec['temperature']):g}"]
    args += [f"{k}={v!r}" for k, v in sampling.items() if v is not None]
    return args


def _budget_args(rec: dict) -> list[str]:
    rule = rule_code(rec)
    if rule is not None:
        return [f"rule={rule}"]
    if float(rec["max_divergence"]) == 0:
        return []
    return [f"max_divergence={float(rec['max_divergence']):g}", f"divergence={rec['divergence']!r}"]


def rule_code(rec: dict) -> str | None:
    """The Python of a point's verification rule (:func:`mdboost.ranking.rule_points.row_rule`),
    or None for MD on sampled drafts (the budget arguments say it).

    >>> rule_code({"rule": "threshold", "drafting": "greedy", "divergence": "kl", "max_divergence": 0.0})
    "Threshold(drafting='greedy', accept=1.0, single=1.0)"
    >>> rule_code({"rule": "match", "drafting": "greedy", "draft_p_min": 0.5, "divergence": "none", "max_divergence": 0.0})
    "Match(drafting='greedy', draft_p_min=0.5)"
    """
    if md_row(rec):
        return None
    # deferred: the rules are torch code (a second to import); most of an export needs none
    from mdboost.ranking.rule_points import row_rule

    return repr(row_rule(rec))


def _rule_import(rec: dict) -> list[str]:
    rule = rule_code(rec)
    return [] if rule is None else [f"from mdboost.md.rules import {rule.split('(')[0]}"]


def _home_arg(home: str | None) -> str:
    """The snippets' ``, home=...`` argument (none for the default home)."""
    return "" if home is None else f", home={home!r}"


def _load_target(rec: dict, device: str, home: str | None) -> str:
    """The snippets' ``load_model`` line: the target converted (or found) in the ranking's home."""
    return f"target, tok = load_model({rec['target']!r}, device={device!r}{_home_arg(home)})"


def mdboost_snippet(rec: dict, sampling: dict, device: str, home: str | None = None) -> str:
    """Python running the recommendation with :func:`mdboost.engine.generate`; ``home``: the
    ranking's mdboost home (its converted models and tuned translators), None for the default.
    The drafter alone (rule ``"alone"``) decodes with the drafter's model, the target unused."""
    if rec["beats_plain_decoding"] and rec.get("rule") == ALONE:
        return _alone_snippet(rec, sampling, device, home)
    speculative = rec["beats_plain_decoding"]
    args = [f"max_new_tokens={MAX_NEW_TOKENS}", *_settings_args(rec, sampling)]
    if speculative:
        args += [f"gamma={int(rec['gamma'])}", *_budget_args(rec)]
    call = (f"out = generate(target, input_ids, settings, "
            f"drafter=drafter_for(target, {rec['drafter']!r}{_home_arg(home)}))"
            if speculative else "out = generate(target, input_ids, settings)  # plain decoding: no drafter pays off")
    return "\n".join([
        "from mdboost.engine import GenerationSettings, generate",
        *(["from mdboost.hf import drafter_for"] if speculative else []),
        *(_rule_import(rec) if speculative else []),
        "from mdboost.models import load_model", "",
        _load_target(rec, device, home),
        f"input_ids = tok({PROMPT!r}, return_tensors=\"pt\").input_ids.to(target.device)",
        f"settings = GenerationSettings({', '.join(args)}, eos_token_id=tok.eos_token_id)",
        call, "print(tok.decode(out.sequences[0]))"])


def _alone_snippet(rec: dict, sampling: dict, device: str, home: str | None) -> str:
    args = [f"max_new_tokens={MAX_NEW_TOKENS}", *_settings_args(rec, sampling)]
    return "\n".join([
        "from mdboost.engine import GenerationSettings, generate",
        "from mdboost.models import build_pool", "",
        f"pool = build_pool({rec['target']!r}, [{rec['drafter']!r}], device={device!r}{_home_arg(home)})",
        f"model, tok = pool[{rec['drafter']!r}].model, pool.target.tokenizer  # the drafter alone: no target step",
        f"input_ids = tok({PROMPT!r}, return_tensors=\"pt\").input_ids.to(model.device)",
        f"settings = GenerationSettings({', '.join(args)}, eos_token_id=tok.eos_token_id)",
        "out = generate(model, input_ids, settings)", "print(tok.decode(out.sequences[0]))"])


def hf_kwargs(rec: dict, sampling: dict, home: str | None = None) -> dict:
    """Keyword arguments of ``target.generate`` for the recommendation, next to
    ``custom_generate=mdboost.hf.mentored_generate`` when drafted (a callable, so not among them:
    transformers reads a string there as a Hub repository); ``home``: the ranking's mdboost home,
    passed on to :func:`mdboost.hf.mentored_generate` with the drafter (None: left out)."""
    sampled = float(rec["temperature"]) > 0
    kwargs = {"do_sample": sampled, "max_new_tokens": MAX_NEW_TOKENS}
    if sampled:  # top_k=0: the ranking's unfiltered sampling (transformers' default with do_sample is top_k=50)
        kwargs["temperature"] = float(rec["temperature"])
        kwargs["top_k"] = 0 if sampling.get("top_k") is None else sampling["top_k"]
        if sampling.get("top_p") is not None:
            kwargs["top_p"] = sampling["top_p"]
    if not rec["beats_plain_decoding"]:
        return kwargs
    md = {"drafter": rec["drafter"], "num_draft_tokens": int(rec["gamma"])}
    if home is not None:
        md["home"] = home
    if rule_code(rec) is None and float(rec["max_divergence"]) > 0:
        md.update(max_divergence=float(rec["max_divergence"]), divergence=rec["divergence"])
    return {**md, **kwargs}


CUSTOM_GENERATE = "mdboost.hf:mentored_generate"  # the import path (module:attribute) of the hf section's callable


def hf_snippet(rec: dict, sampling: dict, device: str, home: str | None = None) -> str:
    """Python running the recommendation through Hugging Face ``generate`` (``home``: as
    :func:`mdboost_snippet`'s)."""
    kwargs = hf_kwargs(rec, sampling, home)
    drafted = bool(rec["beats_plain_decoding"])
    args = ["**inputs"] + (["custom_generate=mdboost.hf.mentored_generate"] if drafted else [])
    args += [f"{k}={v!r}" for k, v in kwargs.items()]
    rule = rule_code(rec) if drafted else None
    if rule is not None:  # the rule object, not a keyword's value: hf_kwargs (JSON) leaves it out
        args.append(f"rule={rule}")
    lines = [f"{args[0]}"]
    for arg in args[1:]:  # wrap the call at about 100 columns
        if len(lines[-1]) + len(arg) > 70:
            lines.append(arg)
        else:
            lines[-1] += f", {arg}"
    call = ",\n                      ".join(lines)
    return "\n".join([*(["import mdboost.hf"] if drafted else []), *(_rule_import(rec) if rule else []),
                      "from mdboost.models import load_model", "",
                      _load_target(rec, device, home),
                      f"inputs = tok({PROMPT!r}, return_tensors=\"pt\").to(target.device)",
                      f"out = target.generate({call})", "print(tok.decode(out[0]))"])


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


_CANNOT = {"early_exit": "an early exit of the target (its first layers) built by mdboost: write it out with --write-drafter",
           "tuned": "an early exit with a tuned-lens translator built by mdboost",
           "int8": "a dynamically int8-quantized CPU copy built by mdboost"}


def server_sampling(rec: dict, sampling: dict) -> dict:
    """The ranked sampling of a point as the servers' keywords (:mod:`mdboost.serve_args`):
    its temperature and the ranking's ``top_k`` / ``top_p``."""
    return dict(temperature=float(rec["temperature"]), top_k=sampling.get("top_k"), top_p=sampling.get("top_p"))


def _engine_section(args: list[str] | None, notes: list[str]) -> dict:
    """A command-line section: its argv (None: nothing to serve), notes and shell text."""
    shell = [f"# {note}" for note in notes] + ([] if args is None else [shlex.join(args)])
    return {"args": args, "notes": notes, "shell": "\n".join(shell)}


def _lossless_note(rec: dict, engine: str, rule: str, greedy: bool = True) -> list[str]:
    """What the engine's lossless rule is; ``greedy``: it drafts the argmax where the rendered
    point's rule sampled the drafts (a point ranked on greedy drafts, or an n-gram draft, is one
    deterministic token in both)."""
    notes = [f"{engine} {rule}: lossless, but its acceptance (q(x) of the drafter's argmax) is not the ranked "
             f"one (drafts sampled from the drafter), so the predicted speedup does not carry over" if greedy else
             f"{engine} {rule}: lossless, a one-hot draft accepted with probability q(x), as ranked"]
    if float(rec["max_divergence"]) > 0:
        notes.append(f"the pick's mentored-decoding budget ({rec['divergence']} <= {float(rec['max_divergence']):g}) "
                     f"is not rendered: this is the lossless point of its drafter and gamma")
    return notes


def _sglang(rec: dict, sampling: dict, home: str | None) -> dict:
    """The ``sglang`` section: the pick's drafter as SGLang's STANDALONE draft model, ``c = s = 1``."""
    model, note = vllm_model(rec["target"], home)  # SGLang loads what vLLM loads, and GGUF files
    if rec["target"].endswith(".gguf"):
        model, note = rec["target"], ""
    notes = [note.replace("vLLM", "SGLang")] if note else []
    if model is None:
        return _engine_section(None, notes)
    settings = server_sampling(rec, sampling)
    if not rec["beats_plain_decoding"]:
        return _engine_section(sglang_args(model, **settings), notes + ["no drafter is reliably faster here: serve the target alone"])
    kind, _ = parse_drafter(rec["drafter"])
    draft, draft_note = vllm_model(rec["drafter"], home) if kind == "hf" else (None, "")
    if kind == "hf" and rec["drafter"].endswith(".gguf"):
        draft, draft_note = rec["drafter"], ""
    if kind == "early_exit":
        draft = written_drafter_path(rec["target"], rec["drafter"], home)
        notes.append(_written_note(rec["target"], rec["drafter"], home))
    if draft is None:
        why = {"ngram": "mdboost's prompt lookup; SGLang's NGRAM drafts a tree from a corpus of the last 18 tokens "
                        "of every request (srt/speculative/ngram_worker.py:396-420), another drafter",
               "hf": draft_note.replace("vLLM", "SGLang")}.get(kind) or _CANNOT[kind]
        return _engine_section(sglang_args(model, **settings),
                               notes + [f"SGLang cannot run the drafter {rec['drafter']!r} ({why}): serving "
                                        f"the target without speculative decoding"])
    accept, single = (_threshold_of(rec, key) for key in ("threshold_acc", "threshold_single"))
    if rec.get("rule") == "threshold" and accept < 1:
        notes.append(f"SGLang's thresholds as ranked (mdboost.md.rules.Threshold, greedy drafts): a draft x is "
                     f"accepted with probability min(1, q(x) / {accept:.6g}), always when q(x) >= {single:.6g}, "
                     f"so every position keeps {rec['divergence']} <= {float(rec['max_divergence']):g} "
                     f"(docs/theory.md, section 11); SGLang applies them at temperature > 0 on CUDA")
    else:
        notes += _lossless_note(rec, "SGLang STANDALONE drafts greedily and, with --speculative-accept-threshold-acc 1 "
                                     "and -single 1,", "accepts x with probability q(x)",
                                greedy=rec.get("drafting") != "greedy")
    return _engine_section(sglang_args(model, draft_model=draft, num_draft_tokens=int(rec["gamma"]), accept=accept,
                                       single=single, **settings), notes)


def _threshold_of(rec: dict, key: str) -> float:
    """SGLang's threshold of a recommended row (1 where the row has none: a lossless rule)."""
    value = rec.get(key)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 1.0
    return value if math.isfinite(value) else 1.0


def _llamacpp(rec: dict, sampling: dict, home: str | None = None) -> dict:
    """The ``llamacpp`` section: ``llama-server`` with the pick's drafter, when llama.cpp can run it."""
    model, note = llamacpp_model(rec["target"])
    notes = [note] if note else []
    if model is None:
        return _engine_section(None, notes)
    settings = server_sampling(rec, sampling)
    if not rec["beats_plain_decoding"]:
        return _engine_section(llamacpp_args(model, **settings), notes + ["no drafter is reliably faster here: serve the target alone"])
    kind, n = parse_drafter(rec["drafter"])
    gamma = int(rec["gamma"])
    if kind == "ngram":
        notes += _lossless_note(rec, "llama.cpp's ngram-simple", "drafts one deterministic token sequence, "
                                "accepted while the target's sample equals it", greedy=False)
        notes.append(f"ngram-simple looks up exactly the last {n} tokens (common/ngram-map.cpp:49-100); mdboost's "
                     f"{rec['drafter']} falls back to shorter suffixes and runs on into its own copy: drafts differ")
        return _engine_section(llamacpp_args(model, ngram=n, draft_max=gamma, **settings), notes)
    draft, draft_note = llamacpp_model(rec["drafter"]) if kind == "hf" else (None, _CANNOT[kind])
    if kind == "early_exit":
        written = written_drafter_path(rec["target"], rec["drafter"], home)
        draft = f"{written}.gguf"
        notes.append(_written_note(rec["target"], rec["drafter"], home) + f"; then `python convert_hf_to_gguf.py "
                     f"{written} --outfile {draft}` (llama.cpp's converter)")
    if draft is None:
        return _engine_section(llamacpp_args(model, **settings),
                               notes + [f"llama.cpp cannot run the drafter {rec['drafter']!r} ({draft_note}): "
                                        f"serving the target without speculative decoding"])
    floor = row_draft_p_min(rec)
    drafts = (f"--spec-draft-p-min {floor:g}: a step stops before a draft whose top-10 probability is below it, as "
              f"ranked" if floor else "--spec-draft-p-min 0: always gamma tokens")
    notes += _lossless_note(rec, f"llama.cpp drafts greedily ({drafts}) and",
                            "accepts while the target's own sample equals the draft",
                            greedy=rec.get("drafting") != "greedy")
    return _engine_section(llamacpp_args(model, draft_model=draft, draft_max=gamma, draft_p_min=floor, **settings),
                           notes)


def llamacpp_command(rec: dict, sampling: dict, home: str | None = None) -> str:
    """The ``llama-server`` command (with its notes as comments) of a point: the target alone
    where no drafter beats plain decoding, else the point's lossless drafting as llama.cpp runs it
    (``mdboost export --format llamacpp`` of a lossless pick).

    >>> rec = {"beats_plain_decoding": False, "target": "/m/t.gguf", "drafter": "ngram:3", "temperature": 0.7}
    >>> print(llamacpp_command(rec, {}).splitlines()[-1])
    llama-server -m /m/t.gguf --temp 0.7 --top-k 0 --top-p 1 --min-p 0
    """
    return _llamacpp(rec, sampling, home)["shell"]


def llamacpp_snippet(rec: dict, sampling: dict, speed_engine: str = "mdboost") -> str | None:
    """Python running a lossy pick ``rec`` in mdboost's loop with llama.cpp doing the forward
    passes (:class:`mdboost.engine.llamacpp.LlamaCppModel`; ``docs/engine.md``), or None where
    that does not apply: a lossless pick (``llama-server`` runs it) of a ranking priced with
    mdboost's engine, none beating plain decoding, a target that is no GGUF file, or a drafter
    llama.cpp cannot run (``tuned:N``, ``int8``). A ranking priced with llama.cpp's costs
    (``speed_engine="llamacpp"``) priced exactly this loop: every pick of it gets the snippet.

    Its drafter: prompt lookup, an early exit written as a truncated GGUF
    (:func:`mdboost.models.gguf_drafters.gguf_drafter`), or a GGUF model.

    >>> rec = {"beats_plain_decoding": True, "rule": "mentored", "drafting": "sampled", "max_divergence": 0.2,
    ...        "divergence": "kl", "target": "/m/t.gguf", "drafter": "early_exit:12", "temperature": 0.7, "gamma": 4}
    >>> print(next(line for line in llamacpp_snippet(rec, {}).splitlines() if line.startswith("drafter")))
    drafter = ModelDrafter(LlamaCppModel(gguf_drafter(TARGET, 'early_exit:12'), n_threads=1))
    """
    lossy = float(rec["max_divergence"]) > 0 or (rec.get("rule") == "threshold" and _threshold_of(rec, "threshold_acc") < 1)
    if not (rec["beats_plain_decoding"] and (lossy or speed_engine == "llamacpp")) or rec.get("rule") == ALONE:
        return None
    model, _ = llamacpp_model(rec["target"])
    kind, n = parse_drafter(rec["drafter"])
    draft = llamacpp_model(rec["drafter"])[0] if kind == "hf" else None
    if model is None or kind in ("tuned", "int8") or (kind == "hf" and draft is None):
        return None
    drafter = {"ngram": f"NgramAdapter(NgramDrafter({n}))",
               "early_exit": f"ModelDrafter(LlamaCppModel(gguf_drafter(TARGET, {rec['drafter']!r}), n_threads=1))",
               "hf": f"ModelDrafter(LlamaCppModel({draft!r}, n_threads=1))"}[kind]
    args = [f"max_new_tokens={MAX_NEW_TOKENS}", *_settings_args(rec, sampling), f"gamma={int(rec['gamma'])}", *_budget_args(rec)]
    return "\n".join([
        f"# the {'lossy ' if lossy else ''}pick in mdboost's loop, llama.cpp doing the forward passes "
        "(pip install 'mdboost[llamacpp]');",
        ("# the ranking priced this loop with llama.cpp's costs (speed.engine: llamacpp)" if speed_engine == "llamacpp"
         else "# llama-server runs only lossless drafting; the ranking priced this point with mdboost's engine costs"),
        "import torch",
        "from mdboost.engine import GenerationSettings, ModelDrafter, NgramAdapter, generate",
        "from mdboost.engine.llamacpp import LlamaCppModel",
        "from mdboost.models.gguf_drafters import gguf_drafter",
        "from mdboost.models.ngram import NgramDrafter",
        *_rule_import(rec), "",
        f"TARGET = {model!r}",
        "target = LlamaCppModel(TARGET, n_threads=1)",
        f"drafter = {drafter}",
        f"input_ids = target.llama.tokenize({PROMPT.encode()!r})",
        f"settings = GenerationSettings({', '.join(args)}, eos_token_id=target.llama.token_eos())",
        "out = generate(target, torch.tensor([input_ids]), settings, drafter=drafter)",
        "print(target.llama.detokenize(out.sequences[0].tolist()).decode(errors='replace'))"])


_RANKING_KEYS = ("recommendation", "sampling", "rows", "device", "source")  # what load_ranking returns


def engine_recommendation(ranking: dict, engine: str) -> tuple[dict, list[str]]:
    """The point to render for ``engine``: the ranking's best row that engine runs
    (``summary.json``'s ``recommendations``, ``docs/ranking.md`` "Rules and engines"), and notes.

    A ranking without per-engine recommendations (from before rules were ranked) gives the overall
    pick. An engine that runs none of the ranked rows gives the overall pick marked as not beating
    plain decoding (so the engine serves the target alone), with the ranking's reason.
    """
    recs = ranking.get("recommendations")
    if not recs or engine not in recs:
        return ranking["recommendation"], []
    entry = recs[engine] or {}
    if entry.get("recommendation"):
        return entry["recommendation"], []
    reason = entry.get("reason") or f"the ranking has no point {engine} can run"
    return dict(ranking["recommendation"], beats_plain_decoding=False), [reason]


def export_plan(ranking: dict) -> dict:
    """The JSON document for a :func:`load_ranking` result (see the module docstring).

    Parameters
    ----------
    ranking : dict
        What :func:`load_ranking` returns (a folder or run id is a TypeError: load it first,
        ``export_plan(load_ranking(source))``).

    Returns
    -------
    dict
        ``source``, ``recommendation``, ``lossless``, ``mdboost``, ``hf``, ``vllm``, ``sglang``
        and ``llamacpp``.
    """
    if isinstance(ranking, (str, os.PathLike)):
        raise TypeError(f"ranking must be the dict returned by load_ranking, got {type(ranking).__name__} "
                        f"{os.fspath(ranking)!r}: call export_plan(load_ranking({os.fspath(ranking)!r}))")
    if not isinstance(ranking, dict):
        raise TypeError(f"ranking must be the dict returned by load_ranking, got {type(ranking).__name__}")
    missing = [k for k in _RANKING_KEYS if k not in ranking]
    if missing:
        raise ValueError(f"ranking lacks {', '.join(missing)}: pass the dict returned by load_ranking")
    _checked(ranking["recommendation"], ranking["rows"], ranking["source"])
    rec, sampling, device = ranking["recommendation"], ranking["sampling"], ranking["device"]
    home = ranking.get("home")  # optional: a dict made before load_ranking returned it
    if home is not None:  # a str, absolute (a hand-made dict may hold a relative path or a Path)
        home = str(mdboost_home(home))
    per_engine = {engine: engine_recommendation(ranking, engine) for engine in ("mdboost", "hf", "vllm", "sglang",
                                                                                "llamacpp")}
    vllm_rec, vllm_notes = per_engine["vllm"]
    vllm = _vllm(vllm_rec, ranking["rows"], sampling, home, ranking.get("batch_rows"))
    vllm["notes"][:0] = vllm_notes
    mdboost_rec, hf_rec = per_engine["mdboost"][0], per_engine["hf"][0]
    sections = {}
    for engine, render_section in (("sglang", lambda r: _sglang(r, sampling, home)),
                                   ("llamacpp", lambda r: _llamacpp(r, sampling, home))):
        point, notes = per_engine[engine]
        section = render_section(point)
        sections[engine] = _engine_section(section["args"], notes + section["notes"]) | {"point": point}
    # a lossy pick (any pick of a ranking priced in llama.cpp) runs on llama.cpp in mdboost's loop
    lossy = llamacpp_snippet(mdboost_rec, sampling, ranking.get("speed_engine", "mdboost"))
    if lossy is not None:
        sections["llamacpp"] |= {"python": lossy, "python_point": mdboost_rec}
    return {"source": ranking["source"], "recommendation": rec, "lossless": float(rec["max_divergence"]) == 0,
            "mdboost": {"python": mdboost_snippet(mdboost_rec, sampling, device, home), "point": mdboost_rec},
            "hf": {"custom_generate": CUSTOM_GENERATE if hf_rec["beats_plain_decoding"] else None,
                   "generate_kwargs": hf_kwargs(hf_rec, sampling, home),
                   "python": hf_snippet(hf_rec, sampling, device, home), "point": hf_rec},
            "vllm": {**vllm, "python": vllm_snippet(vllm), "point": vllm_rec}, **sections}


def render(plan: dict, fmt: str = "json") -> str:
    """``plan`` as JSON (standard JSON: a missing figure, such as an interval bound of a ranking
    without a bootstrap, is ``null``), the Python of its ``mdboost``, ``hf`` or ``vllm`` section,
    or the command line of its ``sglang`` or ``llamacpp`` section (for a lossy pick, the
    ``llamacpp`` section's Python: :func:`llamacpp_snippet`; its lossless command stays in the JSON)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if fmt == "json":
        return json.dumps(json_ready(plan), indent=2, default=str, allow_nan=False)
    return plan[fmt]["python"] if "python" in plan[fmt] else plan[fmt]["shell"]


# ---- the pick's drafter written out as a checkpoint (`mdboost export --write-drafter DIR`) ----------

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
