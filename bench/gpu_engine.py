"""Engine benchmark for an accelerator (``bench/gpu.sh``): SD and MD steps on models of real sizes.

No model file travels to the device machine (the default GGUF alone is 98 MB, over the 64 MiB a
call may carry), so the targets are random Llamas of real shapes built in code
(:func:`mdboost.models.tiny.tiny_llama`): SmolLM2-135M's (30 layers, hidden 576, 9 heads, 3 KV
heads, MLP 1536) with its vocabulary of 49152 and with Qwen2.5's of 151936; the drafter is an
early exit of the target's first layers (:func:`mdboost.models.drafters.early_exit_model`, on the
target's KV cache). Random weights make the acceptance rates meaningless; what this measures is
the cost side on the device: the time of a target call, the verification's share of it
(``GenerationStats.time_verify``, the MD solve included) and MD's time per target call over SD's.
AR, SD and MD (KL budget) runs are interleaved; figures are medians over the repeats.

Run: ``python bench/gpu_engine.py --device cuda`` (writes the section ``engine_<device>`` of
bench/RESULTS.md; ``--no-write`` prints only). A CPU check of the script itself:
``python bench/gpu_engine.py --device cpu --layers 2 --hidden 64 --heads 4 --kv-heads 2
--vocabs 1000 --new-tokens 8 --repeats 1 --no-write``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._results import machine_line, update_section  # noqa: E402
from mdboost.engine import GenerationSettings, ModelDrafter, generate  # noqa: E402
from mdboost.models.drafters import early_exit_model  # noqa: E402
from mdboost.models.loading import synchronize  # noqa: E402
from mdboost.models.tiny import tiny_llama  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vocabs", default="49152,151936", help="comma-separated target vocabularies")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--mlp", type=int, default=1536)
    ap.add_argument("--exit", type=int, default=6, help="drafter: the target's first EXIT layers")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget", type=float, default=0.05, help="MD KL budget")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    for name in ("layers", "hidden", "heads", "kv_heads", "mlp", "exit", "gamma", "prompt_len", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.exit >= args.layers:
        ap.error(f"--exit must be below --layers ({args.layers}), got {args.exit}")
    return args


def measure(args, vocab: int, device: torch.device) -> dict:
    """AR, SD and MD interleaved on one target of ``vocab`` entries: per mode, medians of time per
    target call, verification time per target call, tokens per target call and tokens per second."""
    target = tiny_llama(vocab_size=vocab, num_layers=args.layers, hidden_size=args.hidden, seed=0,
                        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                        intermediate_size=args.mlp).to(device)
    drafter = ModelDrafter(early_exit_model(target, args.exit))
    ids = torch.randint(4, vocab, (1, args.prompt_len), generator=torch.Generator().manual_seed(1)).to(device)
    modes = {
        "ar": (GenerationSettings(max_new_tokens=args.new_tokens), None),
        "sd": (GenerationSettings(max_new_tokens=args.new_tokens, gamma=args.gamma), drafter),
        "md": (GenerationSettings(max_new_tokens=args.new_tokens, gamma=args.gamma, max_divergence=args.budget),
               drafter),
    }
    rows = {m: [] for m in modes}
    for rep in range(args.repeats + 1):  # the first round warms up (kernels, allocator)
        for mode, (settings, draft) in modes.items():
            synchronize(device)
            t0 = time.perf_counter()
            out = generate(target, ids, settings, drafter=draft,
                           generator=torch.Generator(device=device).manual_seed(rep))
            synchronize(device)
            wall = time.perf_counter() - t0
            s = out.stats
            if rep:
                calls = max(s.num_target_calls, 1)
                rows[mode].append(dict(call_ms=1e3 * wall / calls, verify_ms=1e3 * s.time_verify / calls,
                                       tokens_per_call=s.num_new_tokens / calls, tok_s=s.num_new_tokens / wall))
    del target, drafter
    med = statistics.median
    return {m: {k: med(r[k] for r in rs) for k in rs[0]} for m, rs in rows.items()}


def lines_of(args, results: dict, device: torch.device) -> list[str]:
    lines = [
        machine_line(), "",
        f"Random Llama targets ({args.layers} layers, hidden {args.hidden}, {args.heads} heads, {args.kv_heads} KV "
        f"heads, MLP {args.mlp}) on `{device}`, drafter = the target's first {args.exit} layers, gamma "
        f"{args.gamma}, MD KL budget {args.budget}, one prompt of {args.prompt_len} random tokens, "
        f"{args.new_tokens} new tokens, T = 1, medians of {args.repeats} interleaved repeats. Random weights: the "
        f"acceptance is not meaningful, the costs are. `verify` = the engine's `time_verify` (the MD solve "
        f"included) per target call.",
        "",
        "| vocabulary | mode | ms / target call | verify ms / call | tokens / call | tok/s | MD/SD ms per call |",
        "|---|---|---|---|---|---|---|",
    ]
    for vocab, res in results.items():
        ratio = res["md"]["call_ms"] / res["sd"]["call_ms"]
        for mode, r in res.items():
            lines.append(f"| {vocab} | {mode} | {r['call_ms']:.2f} | {r['verify_ms']:.2f} | {r['tokens_per_call']:.2f} "
                         f"| {r['tok_s']:.1f} | {f'{ratio:.3f}' if mode == 'md' else ''} |")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"gpu_engine.py: --device {args.device}: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    results = {int(v): measure(args, int(v), device) for v in args.vocabs.split(",") if v}
    lines = lines_of(args, results, device)
    lines += ["", f"_Total {time.perf_counter() - t0:.0f} s; `python bench/gpu_engine.py --device {args.device}`._"]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        update_section(f"engine_{device.type}", f"## engine_{device.type}: SD and MD steps on the device\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
