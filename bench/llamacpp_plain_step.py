"""Plain decoding's step in llama.cpp against an undrafted step right after a drafted one.

A speedup divides by plain decoding, whose steps all feed one token. llama.cpp reuses its
compute graph when a batch has the previous batch's shape (``src/llama-context.cpp``,
``process_ubatch``; ``llm_graph_params::allow_reuse`` in ``src/llama-graph.h``; llama-cpp-python
0.3.36), so a 1-token forward that follows a 1-token forward may cost less than one that follows
a forward of another width. This script times, on the default GGUF target (one thread), 1-token
forwards after another 1-token forward and after a 5-token forward that is rolled back (as a
rejected draft is), each on the cost measurement's prompt (a random 16-token block repeated to
128 tokens, :func:`mdboost.engine.costs._timing._prompt`) and on the validation's held-out
prompts, the four interleaved per prompt, ``--rounds`` times. Writes the section
``llamacpp_plain_step`` of ``bench/RESULTS.md``: a diagnosis of the llama.cpp validation's misses
(``docs/roadmap.md``).

Run: ``python bench/llamacpp_plain_step.py [--rounds 3] [--prompts 10] [--no-write]`` (needs
``pip install 'mdboost[llamacpp]'``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench._llamacpp_timing import held_out_setup, machine  # noqa: E402
from bench._results import load_line, update_section  # noqa: E402
from mdboost.engine.costs._timing import _prompt  # noqa: E402
from mdboost.engine.kv import model_vocab_size  # noqa: E402

STEPS, SKIPPED, DRAFT = 8, 2, 5  # 1-token forwards per prompt and case, the first ones untimed, the draft's width


def one_token_forwards(target, ids: torch.Tensor, after_draft: bool, gen: torch.Generator) -> list[float]:
    """Seconds of ``STEPS - SKIPPED`` timed 1-token forwards after ``ids`` (a fresh generation),
    each after a rolled-back ``DRAFT``-token forward (``after_draft``) or after the previous one."""
    vocab = model_vocab_size(target)
    lm = target.open(1, torch.device("cpu"))
    lm.forward(ids, None, 1)
    lm.keep([ids.shape[1]])
    out = []
    for j in range(STEPS):
        if after_draft:
            lm.forward(torch.randint(0, vocab, (1, DRAFT), generator=gen), None, 0)
            lm.keep([0])  # rejected: rolled back
        start = time.perf_counter()
        lm.forward(torch.randint(0, vocab, (1, 1), generator=gen), None, 1)
        seconds = time.perf_counter() - start
        lm.keep([1])
        if j >= SKIPPED:
            out.append(seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the prompts")
    parser.add_argument("--prompts", type=int, default=10, help="held-out prompts (the validation's first ones)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    _, target, _, prompts, _ = held_out_setup(args.prompts)
    start = os.getloadavg()[0]
    gen = torch.Generator().manual_seed(0)
    cases = [(context, after) for context in ("cost prompt", "held-out prompts") for after in (False, True)]
    rows = []
    for r in range(args.rounds):
        seconds = {case: [] for case in cases}
        for i, prompt in enumerate(prompts):
            contexts = {"cost prompt": _prompt(model_vocab_size(target), 128, i), "held-out prompts": prompt.view(1, -1)}
            for context, after in cases:
                seconds[(context, after)] += one_token_forwards(target, contexts[context], after, gen)
        rows.append(({case: statistics.median(v) for case, v in seconds.items()}, os.getloadavg()[0]))
        print(f"round {r}: " + ", ".join(f"{c} {'after a draft' if a else 'after a plain step'} "
                                         f"{1e3 * statistics.median(v):.2f} ms" for (c, a), v in seconds.items())
              , flush=True)
    table = ["| round | cost prompt: after a plain step, after a draft (ms) | held-out prompts: after a plain step, "
             "after a draft (ms) | after a draft / after a plain step | load |",
             "|---|---|---|---|---|"]
    for r, (med, load) in enumerate(rows):
        table.append(f"| {r} | {1e3 * med[('cost prompt', False)]:.2f}, {1e3 * med[('cost prompt', True)]:.2f} | "
                     f"{1e3 * med[('held-out prompts', False)]:.2f}, {1e3 * med[('held-out prompts', True)]:.2f} | "
                     f"{med[('cost prompt', True)] / med[('cost prompt', False)]:.3f}, "
                     f"{med[('held-out prompts', True)] / med[('held-out prompts', False)]:.3f} | "
                     f"{load:.2f} |")
    text = "\n\n".join([
        "## llamacpp_plain_step: plain decoding's step in llama.cpp against one right after a drafted step "
        "(`bench/llamacpp_plain_step.py`)",
        f"{machine()} Per round, per prompt: {STEPS - SKIPPED} timed 1-token forwards (after {SKIPPED} untimed) of "
        f"a fresh generation, each after another 1-token forward or after a {DRAFT}-token forward rolled back, on "
        f"the cost measurement's 128-token prompt and on the held-out prompt, the four interleaved; medians over "
        f"{args.prompts} prompts.",
        "\n".join(table),
        load_line(start),
    ])
    print(text)
    if not args.no_write:
        update_section("llamacpp_plain_step", text)


if __name__ == "__main__":
    main()
