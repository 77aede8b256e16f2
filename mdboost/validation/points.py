"""Real runs of ranked operating points: AR, SD and MD generation compared with the prediction.

A ranked *operating point* is one row of ``ranking.csv`` (drafter, target, divergence, budget,
best gamma, predicted acceptance and speedup). :func:`select_points` takes the top ones,
:func:`heldout_prompts` the held-out prompts (never cached or ranked on), :func:`validate_point`
generates on them in AR, SD and MD modes and measures realized acceptance and speedup;
:func:`model_speedup` evaluates the ranking's speed model at a realized acceptance, which
separates the speed model's error from the acceptance prediction's; :func:`points_quality`
summarizes predicted vs realized over all points (:mod:`mdboost.validation.prediction`);
:func:`humaneval_pass_at_1` compares AR and MD completions on HumanEval tasks.

Rows are ``ranking.csv`` rows as read back (strings); everything else is a plain argument.
"""

from __future__ import annotations

import math

import torch

from mdboost.data import TextSource


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _drafter(member):
    return member.ngram if member.kind == "ngram" else member.model


def point_key(row: dict) -> tuple:
    """``(drafter, target, divergence, max_divergence)`` of a ranking row or run params."""
    return (row["drafter"], row["target"], row["divergence"], round(float(row["max_divergence"]), 12))


def select_points(rows: list[dict], top: int, per_pair: bool) -> list[dict]:
    """The first ``top`` distinct operating points (or pairs) of ranking rows sorted by rank.

    Pairs whose target is an ``ngram`` member are skipped; a budget-0 point counts once per pair
    whatever its divergence (it is plain SD).
    """
    rows = sorted(rows, key=lambda r: int(r["rank"]))
    chosen, seen = [], set()
    for r in rows:
        if r["target"] == "ngram" or r["target"].startswith("ngram:"):
            continue
        budget = round(float(r["max_divergence"]), 12)
        key = (r["drafter"], r["target"]) if per_pair else (
            r["drafter"], r["target"], "sd" if budget == 0 else r["divergence"], budget)
        if key not in seen:
            seen.add(key)
            chosen.append(r)
        if len(chosen) == top:
            break
    return chosen


def heldout_prompts(text: TextSource, tokenizer, n: int) -> tuple[list[dict], list[torch.Tensor]]:
    """The first ``n`` held-out records of ``text`` and their prompt ids."""
    from mdboost.data import encode_prompt

    records = text.load("heldout", n)
    if not records:
        raise ValueError(f"text has no held-out records (heldout_fraction={text.heldout_fraction})")
    return records, [encode_prompt(tokenizer, r["prompt"], text.chat_template) for r in records]


def model_speedup(row: dict, alpha: float, md_solve: str) -> float:
    """The ranking's speed model at the row's gamma and costs, evaluated at acceptance ``alpha``
    (a realized one): separates the speed model's error from the acceptance prediction's.
    Rows of older rankings without ``verify_cost`` / ``md_overhead`` columns use 1 and 0."""
    from mdboost.ranking.speed import walltime_speedup

    if not 0 <= alpha <= 1:
        return float("nan")
    return float(walltime_speedup(alpha, int(row["best_gamma"]), float(row["cost_ratio"]),
                                  verify_cost=float(row.get("verify_cost") or 1.0),
                                  md_overhead=float(row.get("md_overhead") or 0.0), md_solve=md_solve,
                                  sd_acceptance=float(row["sd_acceptance"])))


def validate_point(row: dict, pool, prompts, *, max_new_tokens: int = 64, temperature: float = 1.0, seed: int = 0,
                   md_solve: str = "reached") -> dict:
    """Realized AR, SD and MD numbers of one ranked operating point.

    The three modes run interleaved per prompt (:func:`mdboost.validation.runs.run_modes`), so
    the speedups compare runs made under the same machine load. A budget-0 point runs SD only
    (its MD numbers are SD's).
    """
    from mdboost.validation.prediction import predicted_acceptance
    from mdboost.validation.runs import run_modes, target_nll

    target, drafter = pool[row["target"]].model, _drafter(pool[row["drafter"]])
    common = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                  gamma=int(row["best_gamma"]), eos_token_id=pool.target.tokenizer.eos_token_id)
    budget = float(row["max_divergence"])
    modes = {"ar": dict(mode="ar"), "sd": dict(mode="sd", drafter=drafter)}
    if budget > 0:
        modes["md"] = dict(mode="md", drafter=drafter, max_divergence=budget, divergence=row["divergence"],
                           md_solve=md_solve)
    runs = run_modes(target, prompts, modes, **common)
    ar, sd = runs["ar"], runs["sd"]
    md = runs.get("md", sd)
    ar_tps = ar.stats.tokens_per_second
    predicted, from_process = predicted_acceptance(row)
    out = {f"md_{k}": v for k, v in md.metrics().items()}
    out.update({f"sd_{k}": v for k, v in sd.metrics().items()})
    out.update({"ar_tokens_per_second": ar_tps, "realized_speedup": md.stats.tokens_per_second / ar_tps,
                "sd_realized_speedup": sd.stats.tokens_per_second / ar_tps,
                "predicted_acceptance": predicted, "predicted_acceptance_iid": float(row["md_acceptance"]),
                "predicted_acceptance_from_process": float(from_process),
                "predicted_speedup": float(row["predicted_speedup"]),
                "nll_target_md_outputs": target_nll(target, prompts, md.outputs),
                "nll_target_ar_outputs": target_nll(target, prompts, ar.outputs)})
    if _finite(row.get("predicted_speedup_iid")):
        out["predicted_speedup_iid"] = float(row["predicted_speedup_iid"])
    out["realized_acceptance"] = out["md_realized_acceptance"]
    out["expected_acceptance"] = out["md_expected_acceptance"]
    pa = out["predicted_acceptance"]
    out["acceptance_error"] = abs(pa - out["realized_acceptance"])
    out["acceptance_error_expected"] = abs(pa - out["expected_acceptance"])
    out["speedup_error"] = abs(out["predicted_speedup"] - out["realized_speedup"])
    alpha = out["realized_acceptance"] if math.isnan(out["expected_acceptance"]) else out["expected_acceptance"]
    out["model_speedup_at_realized_acceptance"] = model_speedup(row, alpha, md_solve if budget > 0 else "reached")
    out["speedup_model_error"] = abs(out["model_speedup_at_realized_acceptance"] - out["realized_speedup"])
    return out


def iid_acceptance_errors(points: list[tuple[dict, dict]]) -> dict[str, float]:
    """``acceptance_mae_iid`` / ``acceptance_max_error_iid`` (and ``_expected``): the errors the
    i.i.d. prediction ``md_acceptance`` would have, for comparison with the compared one."""
    out = {}
    for key, suffix in (("realized_acceptance", ""), ("expected_acceptance", "_expected")):
        pairs = [(m["predicted_acceptance_iid"], m[key]) for _, m in points if _finite(m[key])]
        if pairs:
            err = [abs(p - r) for p, r in pairs]
            out.update({f"acceptance_mae_iid{suffix}": sum(err) / len(err), f"acceptance_max_error_iid{suffix}": max(err)})
    return out


def points_quality(points: list[tuple[dict, dict]], tolerance: float) -> dict[str, float]:
    """Prediction-quality metrics over ``(row, validate_point result)`` pairs.

    :func:`mdboost.validation.prediction.prediction_quality`'s metrics, plus
    :func:`iid_acceptance_errors` and the speed model's own error fed the realized acceptance
    (``speedup_model_mae`` / ``speedup_model_max_error``).
    """
    from mdboost.validation.prediction import prediction_quality

    column = lambda key: [m[key] for _, m in points]  # noqa: E731
    quality = prediction_quality(column("predicted_acceptance"), column("realized_acceptance"),
                                 column("predicted_speedup"), column("realized_speedup"), tolerance=tolerance,
                                 expected_acceptance=column("expected_acceptance")).as_metrics()
    quality.update(iid_acceptance_errors(points))
    model_err = [e for e in column("speedup_model_error") if not math.isnan(e)]
    if model_err:
        quality.update(speedup_model_mae=sum(model_err) / len(model_err), speedup_model_max_error=max(model_err))
    return quality


def humaneval_pass_at_1(row: dict, pool, text: TextSource, *, tasks: int = 4, max_new_tokens: int = 128,
                        temperature: float = 1.0, seed: int = 0, timeout: float = 10.0,
                        md_solve: str = "reached") -> dict:
    """pass@1 of AR and MD completions (SD at budget 0) on the first ``tasks`` held-out HumanEval tasks."""
    from mdboost.validation import humaneval
    from mdboost.validation.runs import run_mode, truncate_completion

    tok = pool.target.tokenizer
    records, prompts = heldout_prompts(text, tok, tasks)
    problems = humaneval.load_problems()
    common = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, eos_token_id=tok.eos_token_id)
    target = pool[row["target"]].model
    runs = {"ar": run_mode(target, prompts, mode="ar", **common)}
    budget = float(row["max_divergence"])
    md_args = {"max_divergence": budget, "divergence": row["divergence"], "md_solve": md_solve}
    runs["md"] = run_mode(target, prompts, drafter=_drafter(pool[row["drafter"]]),
                          mode="md" if budget > 0 else "sd", gamma=int(row["best_gamma"]),
                          **(md_args if budget > 0 else {}), **common)
    out = {"humaneval_tasks": float(len(records))}
    for mode, run in runs.items():
        completions = {r["id"]: truncate_completion(tok.decode(o)) for r, o in zip(records, run.outputs)}
        out[f"humaneval_pass_at_1_{mode}"] = humaneval.evaluate(problems, completions, timeout=timeout).pass_at_1
    return out
