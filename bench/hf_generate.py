"""Benchmark: mentored decoding through Hugging Face ``generate`` vs mdboost's engine vs HF assisted.

Three ways to run one drafter/target pair at the same settings, interleaved per prompt (the
order rotates each repeat, so a change of machine load hits all alike), one torch thread:

- ``hf``: ``target.generate(**inputs, custom_generate=mdboost.hf.mentored_generate, drafter=...)``;
- ``engine``: :func:`mdboost.engine.generate` with the same drafter and settings;
- ``assisted``: transformers' assisted generation (``assistant_model=``) with the drafter model,
  a constant draft length equal to ``gamma`` and no confidence stop.

Two rows: greedy lossless SD (all three give the same tokens: checked), and the sampled MD point
(budget and divergence of the pick; ``hf`` and ``engine`` share the seed, hence the tokens;
``assisted`` samples its own tokens, losslessly, at the same temperature). Reported: median
tokens/s per path over prompts x repeats, and the ratios hf/engine and hf/assisted.

    .venv/bin/python bench/hf_generate.py [--drafter int8] [--gamma 8] [--budget 0.2]
        [--divergence hellinger] [--temperature 0.7] [--prompts 4] [--new-tokens 32] [--repeats 3] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import mdboost.hf  # noqa: E402
from bench._results import machine_line, update_section  # noqa: E402
from mdboost.data import TextSource  # noqa: E402
from mdboost.engine import GenerationSettings, generate  # noqa: E402
from mdboost.models.pool import build_pool  # noqa: E402
from mdboost.validation.points import heldout_prompts  # noqa: E402

PATHS = ("hf", "engine", "assisted")


def _runners(target, tok, member, drafter, args, sampled: bool):
    """``{path: fn(ids, seed) -> (new token ids, seconds)}`` at one setting."""
    temperature = args.temperature if sampled else 0.0
    budget = dict(max_divergence=args.budget, divergence=args.divergence) if sampled else {}
    # top_k=0: no top-k filter, as the engine's settings (transformers' default with do_sample is top_k=50)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0) if sampled else dict(do_sample=False)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    settings = GenerationSettings(max_new_tokens=args.new_tokens, gamma=args.gamma, temperature=temperature,
                                  eos_token_id=eos, pad_token_id=pad, **budget)
    assistant = member.model
    assistant.generation_config.num_assistant_tokens = args.gamma
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0

    def timed(fn):
        start = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - start

    def hf(ids, seed):
        out, sec = timed(lambda: target.generate(
            ids, custom_generate=mdboost.hf.mentored_generate, drafter=drafter, num_draft_tokens=args.gamma,
            max_new_tokens=args.new_tokens, eos_token_id=eos, pad_token_id=pad,
            generator=torch.Generator().manual_seed(seed), **budget, **sampling))
        return out[0, ids.shape[1]:], sec

    def engine(ids, seed):
        out, sec = timed(lambda: generate(target, ids, settings, drafter=drafter,
                                          generator=torch.Generator().manual_seed(seed)))
        return out.sequences[0, ids.shape[1]:], sec

    def assisted(ids, seed):
        torch.manual_seed(seed)
        out, sec = timed(lambda: target.generate(ids, assistant_model=assistant, max_new_tokens=args.new_tokens,
                                                 eos_token_id=eos, pad_token_id=pad, **sampling))
        return out[0, ids.shape[1]:], sec

    return {"hf": hf, "engine": engine, "assisted": assisted}


def _tokens(row: torch.Tensor, pad: int) -> list[int]:
    row = row.tolist()
    while row and row[-1] == pad:
        row.pop()
    return row


def measure(target, tok, member, drafter, prompts, args, sampled: bool) -> dict:
    """Median tokens/s per path; in greedy mode every path's tokens are checked equal."""
    runners = _runners(target, tok, member, drafter, args, sampled)
    rates = {p: [] for p in PATHS}
    with torch.inference_mode():
        for path in PATHS:  # warm-up: one untimed call per path
            runners[path](prompts[0], 0)
        for rep in range(args.repeats):
            for i, ids in enumerate(prompts):
                outs = {}
                for path in PATHS[rep % 3:] + PATHS[: rep % 3]:
                    new, sec = runners[path](ids, 1000 * rep + i)
                    outs[path] = _tokens(new, tok.pad_token_id)
                    rates[path].append(len(outs[path]) / sec)
                if not sampled and not outs["hf"] == outs["engine"] == outs["assisted"]:
                    raise AssertionError(f"greedy tokens differ on prompt {i}: {outs}")
                if sampled and outs["hf"] != outs["engine"]:
                    raise AssertionError(f"hf and engine tokens differ on prompt {i} (same seed)")
    return {p: statistics.median(r) for p, r in rates.items()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", default="int8", help="the pick of outputs/rank (default pool)")
    parser.add_argument("--gamma", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--divergence", default="hellinger")
    parser.add_argument("--budget", type=float, default=0.2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    pool = build_pool(args.target, [args.drafter], device="cpu")
    target, tok, member = pool.target.model, pool.target.tokenizer, pool[args.drafter]
    if member.model is None:
        raise SystemExit(f"--drafter must be a model drafter (HF assisted needs an assistant model), "
                         f"got {args.drafter!r}")
    drafter = mdboost.hf.drafter_for(target, member.model)
    _, prompts = heldout_prompts(TextSource(sample="head"), tok, args.prompts)  # the first held-out prompts
    prompts = [p[None] if p.ndim == 1 else p for p in prompts]
    rows = {"greedy SD": measure(target, tok, member, drafter, prompts, args, sampled=False),
            f"MD {args.divergence} <= {args.budget:g}, T={args.temperature:g}":
                measure(target, tok, member, drafter, prompts, args, sampled=True)}
    lines = [f"## hf_generate: `generate(custom_generate=mdboost.hf.mentored_generate)` vs the engine vs HF assisted",
             "", machine_line(), "",
             f"Pair `{args.drafter}` -> `{args.target}`, gamma {args.gamma}, {args.prompts} held-out HumanEval "
             f"prompts x "
             f"{args.repeats} repeats, {args.new_tokens} new tokens, batch 1, paths interleaved per prompt; median "
             "tokens/s. Greedy: the three paths give the same tokens (checked). MD: hf and engine share the seed and "
             "the tokens; HF assisted cannot run MD and samples losslessly at the same temperature.", "",
             "| setting | hf tok/s | engine tok/s | HF assisted tok/s | hf / engine | hf / assisted |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['hf']:.1f} | {r['engine']:.1f} | {r['assisted']:.1f} | "
                     f"{r['hf'] / r['engine']:.3f} | {r['hf'] / r['assisted']:.3f} |")
    lines += ["", f"`bench/hf_generate.py --drafter {args.drafter} --gamma {args.gamma} --budget {args.budget:g} "
              f"--divergence {args.divergence} --temperature {args.temperature:g} --prompts {args.prompts} "
              f"--new-tokens {args.new_tokens} --repeats {args.repeats}`"]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        update_section("hf_generate", text)
    return rows


if __name__ == "__main__":
    main()
