"""Block verification's gain over token-wise rejection: expected accepted drafts on LLM-like rows.

For each drafter noise level and draft length ``K``, 32 blocks of ``K`` positions, each position an
independent LLM-like (p, q) pair on ``S = 129`` slots (the ranking's ``2k + 1`` support at
``k = 64``; ``bench/md_core.py``'s profile: base logits ``2.5 N(0, 1)``, each model adds
``sigma N(0, 1)``). Per block: token-wise rejection's ``E[tau] = sum_j prod_{i<=j} (1 - TV_i)``;
block verification's ``E[tau] = sum_j P(tau >= j)`` by :func:`mdboost.md.block.block_acceptance_law`
where its enumeration stays under ``max_states``, else :func:`~mdboost.md.block.block_acceptance_estimate`
(4096 blocks; the standard error shown bounds the largest of one block's E[tau]); greedy drafts (one-hot at ``argmax p``) through the
same law, which ``docs/theory.md`` section 5b proves equal to token-wise rejection's there. A
``block_verify`` run (512 draws per block) checks the law against realized acceptance at ``K = 4``.

Run: ``python bench/block_gain.py`` (about a minute on 2 CPU cores); writes the ``block_gain``
section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import machine_line, update_section  # noqa: E402

from mdboost.md.block import block_acceptance_estimate, block_acceptance_law, block_verify  # noqa: E402

SLOTS, BLOCKS, SIGMAS, LENGTHS = 129, 32, (0.4, 0.8, 1.6), (2, 4, 8)
MC_SAMPLES, DRAWS = 4096, 512


def blocks(sigma, k, seed):  # -> p, q [BLOCKS, K, S] float64
    """LLM-like pairs: shared heavy-tailed base logits, each model its own noise of scale ``sigma``."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(BLOCKS, k, SLOTS, generator=gen, dtype=torch.float64) * 2.5
    draft = base + sigma * torch.randn(BLOCKS, k, SLOTS, generator=gen, dtype=torch.float64)
    target = base + sigma * torch.randn(BLOCKS, k, SLOTS, generator=gen, dtype=torch.float64)
    return torch.softmax(draft, -1), torch.softmax(target, -1)


def block_law(p, q, seed):  # -> P(tau >= j) [BLOCKS, K], largest standard error (0: exact), how
    try:
        return block_acceptance_law(p, q), 0.0, "exact"
    except ValueError:
        mean, err = block_acceptance_estimate(p, q, num_samples=MC_SAMPLES, generator=torch.Generator().manual_seed(seed))
        return mean, float(err.sum(-1).max()), f"MC {MC_SAMPLES}"


def realized(p, q, seed):  # mean accepted drafts of block_verify, DRAWS draws per block
    gen = torch.Generator().manual_seed(seed)
    rows_p = p.repeat_interleave(DRAWS, 0)  # [BLOCKS * DRAWS, K, S]
    rows_q = q.repeat_interleave(DRAWS, 0)
    tokens = torch.multinomial(rows_p.reshape(-1, SLOTS), 1, generator=gen).reshape(rows_p.shape[:2])
    bonus = torch.full_like(rows_q[:, :1], 1 / SLOTS)
    res = block_verify(tokens, rows_p, torch.cat([rows_q, bonus], 1), generator=gen)
    return res.num_accepted.double().mean().item()


def main():
    lines = ["| drafter noise | K | token-wise E[tau] | block E[tau] | gain | greedy: token-wise = block | block law | "
             "realized block (K = 4) |", "|---|---|---|---|---|---|---|---|"]
    for i, sigma in enumerate(SIGMAS):
        for k in LENGTHS:
            p, q = blocks(sigma, k, seed=10 * i + k)
            alpha = torch.minimum(p, q).sum(-1)  # [BLOCKS, K]
            token_wise = alpha.cumprod(-1).sum(-1).mean().item()
            law, err, how = block_law(p, q, seed=k)
            block = law.sum(-1).mean().item()
            one_hot = torch.nn.functional.one_hot(p.argmax(-1), SLOTS).double()
            greedy_block = block_acceptance_law(one_hot, q).sum(-1).mean().item()
            greedy_tw = torch.gather(q, -1, p.argmax(-1, keepdim=True)).squeeze(-1).cumprod(-1).sum(-1).mean().item()
            real = f"{realized(p, q, seed=k):.3f}" if k == 4 else ""
            err_txt = f" (se <= {err:.3f})" if err else ""
            lines.append(f"| {sigma} | {k} | {token_wise:.3f} | {block:.3f}{err_txt} | {block / token_wise - 1:+.1%} | "
                         f"{greedy_tw:.4f} = {greedy_block:.4f} | {how} | {real} |")
            print(lines[-1], flush=True)
    text = "\n".join([
        "## block_gain: block verification vs token-wise rejection (expected accepted drafts)",
        "",
        machine_line(),
        f"{BLOCKS} blocks per row, each position an independent LLM-like pair on {SLOTS} slots "
        "(`bench/block_gain.py` docstring); E[tau] averaged over blocks; block law exact where "
        f"`block_acceptance_law` stays under its state cap, else Monte Carlo ({MC_SAMPLES} blocks; "
        f"bounding the largest standard error of a block's E[tau] by the sum of its terms'). Realized: `block_verify`, {DRAWS} draws "
        "per block.",
        "",
        *lines,
    ])
    update_section("block_gain", text)


if __name__ == "__main__":
    main()
