"""Real runs of ranking cells: AR and SD / MD generation compared with the prediction.

A *cell* is one row of ``ranking.csv`` (drafter, target, temperature, divergence, budget,
gamma, with its predictions; :mod:`mdboost.validation.cells` picks which).
:func:`heldout_prompts` gives the held-out prompts (never cached or ranked on),
:func:`realize_cells` generates on them, every cell interleaved per prompt with the AR run of
its target and temperature, and measures realized acceptance, accepted length and speedup;
:func:`model_speedup` evaluates the ranking's speed model at a realized acceptance, which
separates the speed model's error from the acceptance prediction's;
:func:`humaneval_pass_at_1` compares AR and a cell's completions on HumanEval tasks.

Rows are ``ranking.csv`` rows as read back (strings); everything else is a plain argument.
"""

from __future__ import annotations

import math

import torch

from mdboost._stages import ticking
from mdboost.data import TextSource, encode_prompt
from mdboost.ranking.report import ALONE, row_batch_size
from mdboost.ranking.recommend import md_row
from mdboost.ranking.rule_points import row_rule
from mdboost.ranking.speed import walltime_speedup
from mdboost.validation import humaneval
from mdboost.validation.runs import equal_work_speedup, progress_bar, run_modes, target_nll, truncate_completion


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _float_or_nan(value) -> float:
    return float(value) if _finite(value) else math.nan


def _drafter(member):
    return member.ngram if member.kind == "ngram" else member.model


def heldout_prompts(text: TextSource, tokenizer, n: int, first: int = 0) -> tuple[list[dict], list[torch.Tensor]]:
    """``n`` held-out records of ``text`` from the ``first``-th on (in its sample order:
    ``text.sample``, ``text.stratify``), and their prompt ids."""
    records = text.load("heldout", first + n)[first:]
    if not records:
        raise ValueError(f"text has no held-out records from the {first}-th on "
                         f"(heldout_fraction={text.heldout_fraction})")
    return records, [encode_prompt(tokenizer, r["prompt"], text.chat_template) for r in records]


def model_speedup(row: dict, alpha: float, md_solve: str, *, new_tokens: float = 0.0, prompt_tokens: float = 0.0) -> float:
    """The ranking's i.i.d. speed model at the row's ``gamma`` and costs, evaluated at acceptance
    ``alpha`` (a realized one): separates the speed model's error from the acceptance
    prediction's (``docs/theory.md``, "Speed model for ranking").

    With ``new_tokens`` (``N``, summed over the run's generations) and ``prompt_tokens`` (``F``,
    their prompt tokens beyond one each) the run's prefill is added as the ranking adds it:
    ``(N + beta_t F) / (N / S + (beta_t + beta_d) F)``, ``S`` the steady-state speedup and the
    betas the row's ``prefill_target`` / ``prefill_drafter``. Rows of older rankings without
    ``verify_cost`` / ``md_overhead`` / prefill columns use 1, 0 and 0; NaN without
    ``sd_acceptance`` where ``md_solve="needed"`` needs it."""
    if not 0 <= alpha <= 1:
        return float("nan")
    sd_acceptance = _float_or_nan(row.get("sd_acceptance"))
    if md_solve == "needed" and not math.isfinite(sd_acceptance):
        return float("nan")
    steady = float(walltime_speedup(alpha, int(float(row["gamma"])), float(row["cost_ratio"]),
                                    verify_cost=float(row.get("verify_cost") or 1.0),
                                    md_overhead=float(row.get("md_overhead") or 0.0), md_solve=md_solve,
                                    sd_acceptance=sd_acceptance))
    if not new_tokens:
        return steady
    beta_t, beta_d = (_float_or_nan(row.get(k)) for k in ("prefill_target", "prefill_drafter"))
    beta_t, beta_d = (b if math.isfinite(b) else 0.0 for b in (beta_t, beta_d))
    return (new_tokens + beta_t * prompt_tokens) / (new_tokens / steady + (beta_t + beta_d) * prompt_tokens)


def _cell_modes(row: dict, pool) -> dict:
    """The engine arguments of one cell: MD on sampled drafts as ever (SD at budget 0, else its
    divergence and budget); another rule's row runs its rule (:func:`mdboost.ranking.rule_points.row_rule`,
    the engine's ``GenerationSettings.rule``), lossless or lossy as the rule is."""
    if row.get("rule") == ALONE:  # plain decoding with the drafter's model
        return dict(mode="ar", model=pool[row["drafter"]].model)
    drafter, budget = _drafter(pool[row["drafter"]]), float(row["max_divergence"])
    mode = dict(mode="sd", drafter=drafter, gamma=int(float(row["gamma"])))
    if not md_row(row):
        rule = row_rule(row)
        return mode | dict(mode="sd" if rule.lossless else "md", rule=rule, md_solve=row["md_solve"])
    if budget > 0:
        mode.update(mode="md", max_divergence=budget, divergence=row["divergence"], md_solve=row["md_solve"])
    return mode


def realize_cells(rows: list[dict], pool, prompts, *, max_new_tokens: int = 64, seed: int = 0,
                  top_k: int | None = None, top_p: float | None = None, progress: bool = False,
                  engine_pool=None, passes: int = 1) -> list[dict]:
    """Realized numbers of ranking cells, one dict per row (same order).

    Each row runs at its own ``temperature``, ``gamma``, divergence, budget ``max_divergence``,
    ``md_solve`` (a budget-0 row is SD) and ``batch_size`` (consecutive prompts batched; 1 where
    the row has none); ``top_k`` / ``top_p`` are the ranking's. Cells of one target, temperature
    and batch size run interleaved per batch with one AR run of that target at that batch size
    (:func:`mdboost.validation.runs.run_modes`): batch ``i`` runs AR, then every cell, so every
    speedup divides by the same AR reference made under the same machine load. ``progress``
    shows a bar over the generations (cells and AR runs x prompts x passes) with the tokens/s so far
    (:func:`mdboost.validation.runs.progress_bar`; ``TQDM_DISABLE=1`` silences it). ``passes``
    repeats the whole interleaved sequence (same seeds, same tokens): each pass realizes every
    speedup once more, and their spread is the realized figures' timing noise
    (:func:`mdboost.validation.calibration.timing_noise`).

    ``engine_pool`` holds the members the engine generates with, by the same names (default:
    ``pool``): a :class:`~mdboost.engine.llamacpp.LlamaCppPool` validates in llama.cpp. ``pool``
    gives the tokenizer's end of text and scores every output's NLL under its target.

    Returns
    -------
    list of dict
        Per row: :meth:`~mdboost.validation.runs.ModeRun.metrics` (``realized_acceptance``,
        ``expected_acceptance``, ``mean_accepted_length``, ``tokens_per_second``, ...), plus
        ``ar_tokens_per_second``, ``realized_speedup`` (over AR at the cell's own lengths, over every pass:
        :func:`~mdboost.validation.runs.equal_work_speedup`), ``realized_speedup_passes`` (one per pass),
        ``nll_target_outputs`` / ``nll_target_ar_outputs`` (:func:`~mdboost.validation.runs.target_nll`)
        and ``model_speedup_at_realized_acceptance`` (:func:`model_speedup`).
    """
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r["target"], float(r["temperature"]), row_batch_size(r)), []).append(i)
    total = passes * sum(-(-len(prompts) // b) * (len(m) + 1) for (_, _, b), m in groups.items())
    bar = progress_bar(total, "validation runs", progress)
    out: list[dict] = [{} for _ in rows]
    eos = pool.target.tokenizer.eos_token_id
    engine_pool = pool if engine_pool is None else engine_pool
    for (target_name, temperature, batch_size), members in groups.items():
        target = pool[target_name].model  # scores the outputs
        modes = {"ar": dict(mode="ar")} | {f"cell{i}": _cell_modes(rows[i], engine_pool) for i in members}
        runs = run_modes(engine_pool[target_name].model, prompts, modes, seed=seed, max_new_tokens=max_new_tokens,
                         temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos, on_generation=bar.step,
                         batch_size=batch_size, passes=passes)
        ar = runs["ar"]
        scored = prompts * passes  # the outputs run pass after pass (target_nll scores each distinct one once)
        with ticking(f"scoring the outputs under {target_name} (T={temperature:g}, batch size {batch_size})", progress):
            ar_tps, ar_nll = ar.stats.tokens_per_second, target_nll(target, scored, ar.outputs)
            for i in members:
                run = runs[f"cell{i}"]
                m = run.metrics()
                m.update(ar_tokens_per_second=ar_tps,
                         realized_speedup=equal_work_speedup([g for part in run.generations for g in part],
                                                             [g for part in ar.generations for g in part]),
                         realized_speedup_passes=[equal_work_speedup(c, a)
                                                  for c, a in zip(run.generations, ar.generations)],
                         nll_target_outputs=target_nll(target, scored, run.outputs), nll_target_ar_outputs=ar_nll)
                alpha = m["realized_acceptance"] if math.isnan(m["expected_acceptance"]) else m["expected_acceptance"]
                budget = float(rows[i]["max_divergence"])
                # the i.i.d. model is one sequence's: at B > 1 the batch's slowest row sets the time
                m["model_speedup_at_realized_acceptance"] = math.nan if batch_size > 1 else model_speedup(
                    rows[i], alpha, rows[i]["md_solve"] if budget > 0 else "reached", new_tokens=m["num_new_tokens"],
                    prompt_tokens=passes * float(sum(max(p.numel() - 1, 0) for p in prompts)))
                out[i] = m
    bar.close()
    return out


def humaneval_pass_at_1(row: dict, pool, text: TextSource, *, tasks: int = 4, max_new_tokens: int = 128,
                        seed: int = 0, timeout: float = 10.0, top_k: int | None = None,
                        top_p: float | None = None, engine_pool=None) -> dict:
    """pass@1 of AR and the cell's completions (MD, or SD at budget 0) on the first ``tasks``
    held-out HumanEval tasks of ``text``'s sample order (:func:`heldout_prompts`), at the row's
    ``temperature``, ``gamma``, budget and ``md_solve``; ``engine_pool`` as in :func:`realize_cells`."""
    tok = pool.target.tokenizer
    records, prompts = heldout_prompts(text, tok, tasks)
    problems = humaneval.load_problems()
    engine_pool = pool if engine_pool is None else engine_pool
    runs = run_modes(engine_pool[row["target"]].model, prompts,
                     {"ar": dict(mode="ar"), "md": _cell_modes(row, engine_pool)},
                     seed=seed, max_new_tokens=max_new_tokens, temperature=float(row["temperature"]), top_k=top_k,
                     top_p=top_p, eos_token_id=tok.eos_token_id)
    out = {"humaneval_tasks": float(len(records))}
    for mode, run in runs.items():
        completions = {r["id"]: truncate_completion(tok.decode(o)) for r, o in zip(records, run.outputs)}
        out[f"humaneval_pass_at_1_{mode}"] = humaneval.evaluate(problems, completions, timeout=timeout).pass_at_1
    return out
