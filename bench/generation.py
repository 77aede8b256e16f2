"""Benchmark: AR vs SD vs MD with the engine, side by side with Hugging Face ``generate``.

On the default SmolLM2 pool (CPU by default). For every prompt (batch size 1) and setting it
times: the engine's AR, SD and MD (KL budgets) for each drafter and gamma, and the peer -- HF
``generate`` plain AR, assisted generation with the same drafter model (``assistant_model=``)
and prompt lookup (``prompt_lookup_num_tokens``), all greedy. Reports tokens/s, speedup vs HF
AR, mean accepted length, whether the engine's greedy SD equals HF assisted generation token
for token, and MD vs SD at KL 0.05. Results go to the ``generation`` section of
``bench/RESULTS.md``.

Quick default (fits ~10 min on a loaded 2-core CPU): 4 prompts x 64 tokens, drafters
``early_exit:12`` and ``ngram:3``, gamma 4, budgets 0.05, temperatures 0 and 1.0. The issue's
full grid: ``--prompts 10 --drafters early_exit:12,early_exit:18,early_exit:24,early_exit:27,
tuned:12,tuned:18,tuned:24,tuned:27,int8,ngram:3 --gammas 2,4,6 --budgets 0.01,0.05,0.2
--temperatures 0,1.0,0.7``.

    .venv/bin/python bench/generation.py [--prompts 4] [--new-tokens 64] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench._results import machine_line, update_section  # noqa: E402
from mdboost.data import encode_prompt, load_texts  # noqa: E402
from mdboost.engine import generate  # noqa: E402
from mdboost.models.pool import build_pool  # noqa: E402


def _floats(text):
    return [float(x) for x in text.split(",") if x]


def _ints(text):
    return [int(x) for x in text.split(",") if x]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafters", default="early_exit:12,ngram:3")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--gammas", type=_ints, default=[4])
    ap.add_argument("--budgets", type=_floats, default=[0.05])
    ap.add_argument("--temperatures", type=_floats, default=[0.0, 1.0])
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face peer runs")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true", help="print only, do not update RESULTS.md")
    return ap.parse_args(argv)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_interleaved(configs, prompts, device):
    """Time every config on every prompt, configs interleaved per prompt (so that a change of
    machine load hits all configs alike). Returns per config: tokens, seconds, outputs, stats."""
    results = {key: dict(tokens=0, seconds=0.0, outs=[], stats=[]) for key, _ in configs}
    for ids in prompts:
        for key, fn in configs:
            _sync(device)
            start = time.perf_counter()
            new, extra = fn(ids)
            _sync(device)
            res = results[key]
            res["seconds"] += time.perf_counter() - start
            res["tokens"] += new.numel()
            res["outs"].append(new.tolist())
            if extra is not None:
                res["stats"].append(extra)
        print(f"prompt done ({len(configs)} configs)", flush=True)
    return results


def hf_runner(target, eos, n, **kwargs):
    def run(ids):
        out = target.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos, **kwargs)
        return out[0, ids.shape[1]:], None
    return run


def engine_runner(target, eos, n, seed, **kwargs):
    def run(ids):
        out = generate(target, ids, max_new_tokens=n, eos_token_id=eos,
                       generator=torch.Generator(device=ids.device).manual_seed(seed), **kwargs)
        return out.sequences[0, ids.shape[1]: ids.shape[1] + out.num_new_tokens[0]], out.stats
    return run


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    pool = build_pool(args.target, [d for d in args.drafters.split(",") if d], device=device)
    target, tok = pool.target.model, pool.target.tokenizer
    eos = tok.eos_token_id
    records = load_texts("humaneval", limit=args.prompts)
    prompts = [encode_prompt(tok, r["prompt"])[None].to(device) for r in records]
    n = args.new_tokens
    configs = []
    greedy = 0.0 in args.temperatures
    if not args.no_hf and greedy:
        configs.append((("hf_ar", 0.0, None, None, None), hf_runner(target, eos, n)))
    for temp in args.temperatures:
        configs.append((("ar", temp, None, None, None), engine_runner(target, eos, n, args.seed, mode="ar", temperature=temp)))
        for member in pool.drafters:
            drafter = member.ngram if member.kind == "ngram" else member.model
            for gamma in args.gammas:
                common = dict(drafter=drafter, gamma=gamma, temperature=temp)
                if temp == 0.0 and not args.no_hf:
                    peer = dict(prompt_lookup_num_tokens=gamma) if member.kind == "ngram" else dict(
                        assistant_model=drafter, num_assistant_tokens=gamma, num_assistant_tokens_schedule="constant")
                    configs.append((("hf_assisted", 0.0, member.name, gamma, None), hf_runner(target, eos, n, **peer)))
                configs.append((("sd", temp, member.name, gamma, 0.0),
                                engine_runner(target, eos, n, args.seed, mode="sd", **common)))
                if temp > 0:  # at temperature 0 q is one-hot and MD reduces to SD
                    for budget in args.budgets:
                        configs.append((("md", temp, member.name, gamma, budget), engine_runner(
                            target, eos, n, args.seed, mode="md", max_divergence=budget, **common)))
    for fn in (hf_runner(target, eos, 2), engine_runner(target, eos, 2, args.seed, mode="ar")):
        fn(prompts[0])  # warm-up: first-call costs stay out of the timings
    results = run_interleaved(configs, prompts, device)
    rows, outputs = [], {}
    for key, res in results.items():
        stats = res["stats"]
        drafts = sum(s.num_drafts for s in stats)
        accepted = sum(s.num_accepted_tokens for s in stats)
        name, temp, drafter, gamma, budget = key
        rows.append(dict(name=name, temperature=temp, drafter=drafter, gamma=gamma, budget=budget,
                         tps=res["tokens"] / res["seconds"], tokens=res["tokens"],
                         mal=1 + accepted / drafts if drafts else float("nan"),
                         div=max((s.max_divergence for s in stats), default=0.0)))
        outputs[key] = res["outs"]
    markdown = report(rows, outputs, args)
    print(markdown)
    if not args.no_write:
        update_section("generation", markdown)


def report(rows, outputs, args) -> str:
    base = {r["temperature"]: r["tps"] for r in rows if r["name"] == "hf_ar"}
    ours_ar = {r["temperature"]: r["tps"] for r in rows if r["name"] == "ar"}
    lines = [
        "## Generation engine: AR / SD / MD vs Hugging Face `generate`",
        "",
        machine_line(),
        f"_`bench/generation.py`: target {args.target}, {args.prompts} HumanEval prompts x {args.new_tokens} new "
        f"tokens (EOS stops), batch 1, drafters {args.drafters}, gammas {args.gammas}, KL budgets {args.budgets}, "
        f"temperatures {args.temperatures}. Speedups vs HF AR greedy (T=0) and vs the engine's AR "
        "at the same temperature._",
        "",
        "| run | T | drafter | gamma | KL budget | tok/s | vs HF AR | vs engine AR | mean accepted length | max realized KL |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        hf = base.get(0.0)
        vs_hf = f"{r['tps'] / hf:.2f}x" if hf else "-"
        lines.append(
            f"| {r['name']} | {r['temperature']} | {r['drafter'] or '-'} | {r['gamma'] or '-'} | "
            f"{'-' if r['budget'] is None else r['budget']} | {r['tps']:.2f} | "
            f"{vs_hf} | {r['tps'] / ours_ar[r['temperature']]:.2f}x | "
            f"{r['mal']:.2f} | {r['div']:.4f} |"
        )
    lines += ["", *summary(rows, outputs)]
    return "\n".join(lines)


def summary(rows, outputs):
    out = []
    keys = [k for k in outputs if k[0] == "hf_assisted"]
    for key in keys:
        ours = outputs.get(("sd", 0.0, key[2], key[3], 0.0))
        if ours is not None:
            same = ours == outputs[key]
            out.append(f"- Greedy SD vs HF {'assisted' if 'ngram' not in key[2] else 'prompt lookup'} "
                       f"({key[2]}, gamma {key[3]}): token-for-token identical: **{same}**.")
    hf_ar = outputs.get(("hf_ar", 0.0, None, None, None))
    if hf_ar is not None and ("ar", 0.0, None, None, None) in outputs:
        out.append(f"- Engine greedy AR equals HF greedy AR: **{outputs[('ar', 0.0, None, None, None)] == hf_ar}**.")
    for r in rows:
        if r["name"] == "md" and r["budget"] == 0.05:
            sd = next(s for s in rows if s["name"] == "sd" and s["temperature"] == r["temperature"]
                      and s["drafter"] == r["drafter"] and s["gamma"] == r["gamma"])
            out.append(f"- MD (KL 0.05) / SD tok/s at T={r['temperature']}, {r['drafter']}, gamma {r['gamma']}: "
                       f"**{r['tps'] / sd['tps']:.2f}x** (mean accepted length {r['mal']:.2f} vs {sd['mal']:.2f}).")
    best = max((r for r in rows if r["name"] in ("sd", "md")), key=lambda r: r["tps"] / next(
        a["tps"] for a in rows if a["name"] == "ar" and a["temperature"] == r["temperature"]), default=None)
    if best is not None:
        out.append(f"- Best configuration vs engine AR at the same temperature: {best['name']} T={best['temperature']} "
                   f"{best['drafter']} gamma {best['gamma']} budget {best['budget']}.")
    return out


if __name__ == "__main__":
    main()
