"""Does a drafter draft the same in a batch? Greedy speculative decoding at batch size 1 and 4 on the same prompts.

At temperature 0 with greedy drafts everything is deterministic: a drafter that computes each row
as it would alone proposes the same drafts at batch size 4 (left-padded rows) as at batch size 1,
so the accepted draft tokens are equal, as are the outputs (lossless: the target's own argmax).
The ranking predicts acceptance at every batch size from logits cached one sequence at a time,
so it relies on exactly this. Per drafter this script prints the accepted draft tokens at each
batch size, the drafted tokens (a batch drafts up to its longest row's remaining tokens, so more
at B = 4), and whether the outputs are equal row by row, and writes the section
``batch_invariance`` of ``bench/RESULTS.md``.

Run: ``python bench/batch_invariance.py [--drafters int8 tuned:12 early_exit:12] [--prompts 4] [--no-write]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import load_line, update_section  # noqa: E402
from mdboost.cache.profile import hardware_fingerprint, hardware_label  # noqa: E402
from mdboost.data import TextSource  # noqa: E402
from mdboost.models.pool import build_pool  # noqa: E402
from mdboost.validation.points import heldout_prompts  # noqa: E402
from mdboost.validation.runs import run_modes  # noqa: E402


def _drafter(member):
    return member.ngram if member.kind == "ngram" else member.model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafters", nargs="+", default=["int8", "tuned:12", "early_exit:12", "ngram:3"])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = os.getloadavg()[0]
    pool = build_pool("smollm2-135m", args.drafters, device="cpu")
    _, prompts = heldout_prompts(TextSource(sample="head"), pool.target.tokenizer, args.prompts)  # the first held-out
    differ = []
    rows = ["| drafter | accepted B=1 | accepted B=4 | drafted B=1 | drafted B=4 | outputs equal per row |",
            "|---|---|---|---|---|---|"]
    with torch.inference_mode():
        for spec in args.drafters:
            runs = {b: run_modes(pool.target.model, prompts, {"sd": dict(drafter=_drafter(pool[spec]), mode="sd")},
                                 batch_size=b, gamma=4, temperature=0.0, max_new_tokens=args.new_tokens,
                                 eos_token_id=None)["sd"] for b in (1, 4)}
            same = [a == b for a, b in zip(runs[1].outputs, runs[4].outputs)]
            if runs[1].stats.num_accepted_tokens != runs[4].stats.num_accepted_tokens:
                differ.append(spec)
            rows.append(f"| {spec} | {runs[1].stats.num_accepted_tokens} | {runs[4].stats.num_accepted_tokens} | "
                        f"{runs[1].stats.num_draft_tokens} | {runs[4].stats.num_draft_tokens} | "
                        f"{sum(same)} of {len(same)} |")
    text = "\n\n".join([
        "## batch_invariance: the same drafts alone and in a batch (`bench/batch_invariance.py`)",
        f"{hardware_label(hardware_fingerprint('cpu'))}; SmolLM2-135M target, {args.prompts} held-out HumanEval "
        f"prompts, greedy SD (temperature 0, gamma 4), {args.new_tokens} new tokens, batch size 1 against 4 "
        "(left-padded).", "\n".join(rows),
        f"Accepted counts differ for: {', '.join(differ) or 'none'}. Equal counts: the drafter drafts each row as "
        "it would alone. A batch drafts up to its longest row's remaining tokens, so a row near its end can "
        "have drafts accepted that alone it would not draft (more accepted at B = 4); fewer accepted means the "
        "drafts themselves changed. The slowest row sets a batch's step count and drafts within its own "
        "remaining tokens, so drafting past the other rows' ends does not change the batch's steps. The int8 "
        "drafter quantizes each token's activations with its own scale (`TokenScaledInt8Linear`); with "
        "`torch.ao`'s dynamic `Linear` (one scale for the whole input, shared by a batch's rows) the same run "
        "accepted 85 tokens at B = 1 against 81 at B = 4 (Intel Xeon, AVX-512 VNNI, 1 thread, torch 2.13.0; "
        "the section's previous version).",
        load_line(start)])
    print(text)
    if not args.no_write:
        update_section("batch_invariance", text)


if __name__ == "__main__":
    main()
