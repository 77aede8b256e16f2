"""Benchmark: does MD's own text raise prompt lookup's acceptance beyond the ranking's prediction?

The ranking predicts model drafters' points from continuations the *target* sampled
(``cache.acceptance_source: sampled``), and prompt lookup's points with a budget from
continuations MD sampled at that point (``cache.mentored_text``); a lossy point's engine emits
``pi``, not ``q`` (``docs/ranking.md``, "The text is the target's"). This script separates that
cause from prompt differences: it runs the engine on the ranking's **own** cache prompts (the records the
continuations were sampled from, same encoding, same 64 new tokens), SD and MD at the same
temperature and gamma, several seeds, and compares the realized mean accepted length with the
ranking's predicted ``engine_mean_accepted_length`` (``outputs/rank-full/ranking.csv`` of
``configs/full.yaml``: run ``mdboost rank --config configs/full.yaml`` first). A model drafter (int8) is the control.
Acceptance statistics only: no timing, so machine load does not matter.

Usage: ``.venv/bin/python bench/text_feedback.py [--seeds 3] [--no-write]``; about 10 minutes.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import machine_line, update_section  # noqa: E402
from pipelines.config import RankConfig  # noqa: E402
from pipelines.loader import load_yaml  # noqa: E402

POINTS = (("ngram:3", "none", 0.0), ("ngram:3", "kl", 0.2), ("int8", "none", 0.0), ("int8", "kl", 0.2))
TEMPERATURE, GAMMA = 0.7, 6


def predicted(ranking: Path) -> dict:
    """``(drafter, divergence, budget) -> predicted engine_mean_accepted_length`` at the bench's T and gamma."""
    out = {}
    with open(ranking, newline="") as fh:
        for r in csv.DictReader(fh):
            if float(r["temperature"]) == TEMPERATURE and int(float(r["gamma"])) == GAMMA:
                out[(r["drafter"], r["divergence"], float(r["max_divergence"]))] = (
                    float(r["engine_mean_accepted_length"]), float(r["engine_mean_accepted_length_lo"]),
                    float(r["engine_mean_accepted_length_hi"]))
    return out


def realized(cfg: RankConfig, seeds: int) -> dict:
    """``point -> [mean accepted length per seed]`` of the engine on the ranking's cache prompts."""
    from mdboost.data import encode_prompt
    from mdboost.engine import GenerationSettings, as_drafter, generate
    from mdboost.models.pool import build_pool

    torch.set_num_threads(1)
    text = cfg.data.text_source()
    records = text.load()
    pool = build_pool(cfg.pool.target, sorted({d for d, _, _ in POINTS}), device=cfg.pool.device)
    tok = pool.target.tokenizer
    prompts = [encode_prompt(tok, r["prompt"], text.chat_template)[None] for r in records]
    new_tokens = cfg.cache.acceptance_max_new_tokens
    out = {}
    for drafter_name, divergence, budget in POINTS:
        member = pool[drafter_name]
        drafter = as_drafter(member.ngram if member.kind == "ngram" else member.model)
        settings = GenerationSettings(max_new_tokens=new_tokens, temperature=TEMPERATURE, gamma=GAMMA,
                                      max_divergence=budget, divergence="kl" if divergence == "none" else divergence,
                                      eos_token_id=tok.eos_token_id)
        per_seed = []
        for seed in range(seeds):
            accepted = drafts = 0
            for i, ids in enumerate(prompts):
                res = generate(pool.target.model, ids, settings, drafter=drafter,
                               generator=torch.Generator().manual_seed(1000 * seed + i))
                accepted += res.stats.num_accepted_tokens
                drafts += res.stats.num_drafts
            per_seed.append(1 + accepted / drafts if drafts else float("nan"))
            print(f"{drafter_name} {divergence} {budget:g} seed {seed}: mean accepted length {per_seed[-1]:.3f}",
                  flush=True)
        out[(drafter_name, divergence, budget)] = per_seed
    return out


def report(pred: dict, real: dict, prompts: int, seeds: int) -> str:
    lines = [
        "## text_feedback: MD's own text and prompt lookup",
        "",
        machine_line(),
        "",
        f"`bench/text_feedback.py`: the engine on the ranking's own {prompts} cache prompts (the records its "
        f"continuations were sampled from), T = {TEMPERATURE:g}, gamma {GAMMA}, {seeds} seeds, 64 new tokens, "
        "against the ranking's predicted mean accepted length (`outputs/rank-full/ranking.csv`, 90% interval). Same "
        "prompts, so a gap is the speed model's, not the prompt set's.",
        "",
        "| drafter | point | predicted [90%] | realized (mean of seeds) | seeds | realized - predicted |",
        "|---|---|---|---|---|---|",
    ]
    for key in POINTS:
        p, lo, hi = pred[key]
        r = real[key]
        name = "SD" if key[1] == "none" else f"{key[1]} <= {key[2]:g}"
        lines.append(f"| {key[0]} | {name} | {p:.2f} [{lo:.2f}, {hi:.2f}] | {statistics.fmean(r):.2f} | "
                     f"{', '.join(f'{x:.2f}' for x in r)} | {statistics.fmean(r) - p:+.2f} |")
    gain = {d: (statistics.fmean(real[(d, "kl", 0.2)]) - statistics.fmean(real[(d, "none", 0.0)]),
                pred[(d, "kl", 0.2)][0] - pred[(d, "none", 0.0)][0]) for d in ("ngram:3", "int8")}
    lines += ["", "The budget's gain in mean accepted length (KL 0.2 minus SD), realized vs predicted: " + "; ".join(
        f"{d} {r:+.2f} vs {p:+.2f}" for d, (r, p) in gain.items()) + "."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/full.yaml")
    ap.add_argument("--ranking", type=Path, default=ROOT / "outputs" / "rank-full" / "ranking.csv")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    cfg = load_yaml(ROOT / args.config, RankConfig)
    pred = predicted(args.ranking)
    missing = [k for k in POINTS if k not in pred]
    if missing:
        raise SystemExit(f"{args.ranking} has no rows for {missing}: run `mdboost rank --config configs/full.yaml` first")
    text = report(pred, realized(cfg, args.seeds), cfg.data.limit, args.seeds)
    print(text)
    if not args.no_write:
        update_section("text_feedback", text)


if __name__ == "__main__":
    main()
