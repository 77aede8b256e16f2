"""mdboost's loop on llama.cpp against llama-cpp-python's own decoding, side by side in one process.

Every configuration decodes the same prompts, interleaved per prompt and repeat (one thread each),
and the medians of tokens/s are compared as ratios to llama-cpp-python's own ``Llama.generate``
(plain decoding, the baseline a CPU user already has):

- ``llama generate``: ``Llama.generate`` (``llama_cpp/llama.py`` 854-1025 in 0.3.36), greedy
  (``temp=0``) or sampled (``temp=T``, ``top_k=0``, ``top_p=1``, ``min_p=0``: the plain
  distribution, as mdboost samples it);
- ``llama lookup``: llama-cpp-python's own speculative path, ``Llama(draft_model=
  LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=G))`` (``llama_speculative.py``;
  ``generate`` keeps a draft while the target's own sample equals it, lines 1003-1025: lossless,
  drafting driven from Python);
- ``mdboost AR``: :func:`mdboost.engine.generate` with :class:`~mdboost.engine.llamacpp.LlamaCppModel`
  as the target, no drafter: the loop's own tax;
- ``mdboost SD lookup``: the same with prompt lookup (``ngram:3``), lossless;
- ``mdboost MD lookup``: mentored decoding with prompt lookup at a KL budget (sampled only);
- ``mdboost SD / MD early_exit:N``: the same loop drafting with the target's first ``N`` blocks
  written as a GGUF of their own (:func:`mdboost.models.gguf_drafters.gguf_drafter`), its own
  llama.cpp cache; ``quant:<TYPE>``: the target requantized by ``llama_model_quantize``.

The closing lines put the best lossy (MD) point beside the best lossless one at the sampled
temperature and greedy: tokens/s and ratio to ``llama generate``. llama-cpp-python's ``Llama``
takes no GGUF draft model (its ``draft_model`` is a Python prompt-lookup class), so model
drafters on llama.cpp run through mdboost's loop here; ``llama-server -md`` is llama.cpp's own.

Greedy outputs of ``mdboost AR`` are compared token by token with ``llama generate``'s. Writes the
section ``llamacpp`` of ``bench/RESULTS.md``.

Run: ``python bench/llamacpp.py [--prompts 6] [--repeats 3] [--tokens 64] [--gamma 4] [--exits 12,24]
[--quant Q4_0] [--no-write]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import load_line, update_section  # noqa: E402
from mdboost.cache.profile import hardware_fingerprint, hardware_label  # noqa: E402
from mdboost.data import load_texts  # noqa: E402
from mdboost.engine import GenerationSettings, ModelDrafter, NgramAdapter, generate  # noqa: E402
from mdboost.engine.llamacpp import LlamaCppModel  # noqa: E402
from mdboost.models.convert import smollm2_gguf  # noqa: E402
from mdboost.models.gguf_drafters import gguf_drafter  # noqa: E402
from mdboost.models.ngram import NgramDrafter  # noqa: E402


def _own(llama, prompt: list[int], tokens: int, temperature: float) -> list[int]:
    out = []
    kw = dict(temp=temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    llama.reset()  # else generate reuses the KV of the same prompt's previous run and skips its prefill
    for token in llama.generate(prompt, **kw):  # past EOS too: every configuration decodes the same count
        out.append(int(token))
        if len(out) == tokens:
            break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--budget", type=float, default=0.2, help="MD's KL budget")
    parser.add_argument("--exits", default="12,24", help="early exits drafted as truncated GGUFs ('' for none)")
    parser.add_argument("--quant", default="Q4_0", help="a requantized target as drafter ('' for none)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    start = os.getloadavg()[0]
    folder, name = smollm2_gguf()
    path = str(folder / name)
    n_ctx = 1024
    own = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=1, n_threads_batch=1, verbose=False, seed=0)
    lookup = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=1, n_threads_batch=1, verbose=False, seed=0,
                             draft_model=LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=args.gamma))
    backend = LlamaCppModel(path, n_ctx=n_ctx, n_threads=1)
    records = load_texts("humaneval")[:args.prompts]
    prompts = [own.tokenize(r["prompt"].encode())[:320] for r in records]
    T, G = args.temperature, args.gamma

    def ours(prompt, temperature, drafter=None, budget=0.0, seed=0):
        settings = GenerationSettings(max_new_tokens=args.tokens, temperature=temperature, gamma=G,
                                      max_divergence=budget)  # no EOS: the same token count everywhere
        out = generate(backend, torch.tensor([prompt]), settings, drafter=drafter,
                       generator=torch.Generator().manual_seed(seed))
        return out.sequences[0, len(prompt):].tolist(), out.stats.num_new_tokens

    lookup3 = NgramAdapter(NgramDrafter(3))
    configs = {
        "llama generate, greedy": lambda p, s: (lambda t: (t, len(t)))(_own(own, p, args.tokens, 0.0)),
        "llama lookup, greedy": lambda p, s: (lambda t: (t, len(t)))(_own(lookup, p, args.tokens, 0.0)),
        "mdboost AR, greedy": lambda p, s: ours(p, 0.0),
        "mdboost SD lookup, greedy": lambda p, s: ours(p, 0.0, lookup3),
        f"llama generate, T={T:g}": lambda p, s: (lambda t: (t, len(t)))(_own(own, p, args.tokens, T)),
        f"mdboost AR, T={T:g}": lambda p, s: ours(p, T, seed=s),
        f"mdboost SD lookup, T={T:g}": lambda p, s: ours(p, T, lookup3, seed=s),
        f"mdboost MD lookup kl {args.budget:g}, T={T:g}": lambda p, s: ours(p, T, lookup3, args.budget, seed=s),
    }
    B = args.budget
    model_drafters = [f"early_exit:{n}" for n in args.exits.split(",") if n] + ([f"quant:{args.quant}"] if args.quant else [])
    for spec in model_drafters:
        drafter = ModelDrafter(LlamaCppModel(gguf_drafter(path, spec), n_ctx=n_ctx, n_threads=1))
        configs[f"mdboost SD {spec}, greedy"] = lambda p, s, d=drafter: ours(p, 0.0, d)
        configs[f"mdboost SD {spec}, T={T:g}"] = lambda p, s, d=drafter: ours(p, T, d, seed=s)
        configs[f"mdboost MD {spec} kl {B:g}, T={T:g}"] = lambda p, s, d=drafter: ours(p, T, d, B, seed=s)
    rates = {k: [] for k in configs}
    outputs = {}
    for rep in range(args.repeats):
        for i, prompt in enumerate(prompts):
            for name_, run in configs.items():
                t0 = time.perf_counter()
                toks, n = run(prompt, 1000 * rep + i)
                rates[name_].append(n / (time.perf_counter() - t0))
                if rep == 0:
                    outputs[name_, i] = toks
    med = {k: statistics.median(v) for k, v in rates.items()}
    same = sum(outputs["mdboost AR, greedy", i] == outputs["llama generate, greedy", i] for i in range(len(prompts)))
    same_sd = sum(outputs["mdboost SD lookup, greedy", i] == outputs["llama generate, greedy", i]
                  for i in range(len(prompts)))
    same_lookup = sum(outputs["llama lookup, greedy", i] == outputs["llama generate, greedy", i]
                      for i in range(len(prompts)))
    base_g, base_t = med["llama generate, greedy"], med[f"llama generate, T={T:g}"]
    lines = [
        "## llamacpp: mdboost's loop on llama.cpp against llama-cpp-python's own decoding (`bench/llamacpp.py`)",
        "",
        f"Machine: {hardware_label(hardware_fingerprint('cpu'))}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"Python {platform.python_version()}, llama-cpp-python {llama_cpp.__version__} (built from its sdist on this "
        f"machine), 1 thread for every configuration (llama.cpp's decode and torch's). Model: the default `{name}` (target, and prompt lookup `ngram:3`). "
        f"{len(prompts)} HumanEval prompts x {args.repeats} repeats, interleaved per prompt; {args.tokens} new "
        f"tokens each (past EOS: the same count everywhere); gamma {G}; medians of tokens/s over the {len(prompts) * args.repeats} runs; ratios "
        "to `llama generate` at the same temperature.",
        "",
        "| configuration | tokens/s (median) | ratio to llama generate |",
        "|---|---|---|",
    ]
    for k, v in med.items():
        base = base_g if "greedy" in k else base_t
        lines.append(f"| {k} | {v:.1f} | {v / base:.3f} |")
    def best(keys):
        return max(keys, key=lambda k: med[k])

    sampled = [k for k in med if k.endswith(f"T={T:g}") and not k.startswith(("llama generate", "mdboost AR"))]
    lossy = best([k for k in sampled if " MD " in k])
    lossless = best([k for k in sampled if " MD " not in k])
    greedy = best([k for k in med if k.endswith("greedy") and not k.startswith(("llama generate", "mdboost AR"))])
    lines += ["", f"Best lossy point at T={T:g}: `{lossy}`, {med[lossy]:.1f} tokens/s ({med[lossy] / base_t:.3f}x "
              f"plain llama.cpp); best lossless point: `{lossless}`, {med[lossless]:.1f} tokens/s "
              f"({med[lossless] / base_t:.3f}x). Greedy: `{greedy}`, {med[greedy] / base_g:.3f}x."]
    lines += ["", f"Greedy output (first repeat) equal to `llama generate`'s: `mdboost AR` on {same} of "
              f"{len(prompts)} prompts, `mdboost SD lookup` on {same_sd}, llama-cpp-python's own `llama lookup` "
              f"on {same_lookup}.", "", load_line(start)]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        update_section("llamacpp", text)


if __name__ == "__main__":
    main()
