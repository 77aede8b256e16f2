"""The ``generation`` section of ``bench/RESULTS.md``, built from the cells of ``bench/generation.py``.

Tables per temperature (drafter x gamma: speedup vs the same process's AR, mean accepted
length), the greedy Hugging Face peer lines, MD-vs-SD win counts (per temperature, and per
drafter kind with geometric means), the best configuration per temperature and the coverage
of the generation grid. Pure functions of the cells file: nothing here measures anything
(``bench/generation.py --report-only`` rebuilds the section).
"""

from __future__ import annotations

import statistics

from bench._generation_grid import PEER_CONFIDENCE, SETTINGS, drafter_priority, grid_keys, settings_of
from mdboost.models.specs import parse_drafter


def _mal(cell) -> str:
    mal = cell.get("mean_accepted_length")
    return "-" if mal is None else f"{mal:.2f}"


def _over_sd(cell) -> float:
    """An MD cell's tok/s over the SD of the same drafter, gamma and process."""
    return cell["tok_s"] / cell["references"]["sd"]["tok_s"]


def _fmt(cell) -> str:
    return "-" if cell is None else f"{cell['speedup_vs_ar']:.2f}x ({_mal(cell)})"


def _ar_line(cells, temp) -> str:
    refs = sorted({(c["run_id"], c["chunk"]): c["references"]["ar"]["tok_s"] for c in cells}.values())
    return (f"Engine AR at T={temp}: median {statistics.median(refs):.2f} tok/s over {len(refs)} chunk(s) "
            f"({refs[0]:.2f} to {refs[-1]:.2f}).")


def temperature_table(cells, temp) -> list[str]:
    """Rows drafter x gamma; columns SD and MD per budget: speedup vs same-process AR (MAL)."""
    mine = [c for c in cells if c["mode"] in ("sd", "md") and c["temperature"] == temp]
    budgets = sorted({c["budget"] for c in mine if c["mode"] == "md"})
    index = {(c["drafter"], c["gamma"], c["mode"], c["budget"]): c for c in mine}
    rows = sorted({(c["drafter"], c["gamma"]) for c in mine}, key=lambda r: (drafter_priority(r[0]), r))
    head = ["drafter", "gamma", "SD"] + [f"MD KL {b:g}" for b in budgets] + (["MD 0.05 / SD"] if temp > 0 else [])
    lines = [f"**T = {temp}.** {_ar_line(mine, temp)}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for drafter, gamma in rows:
        row = [drafter, str(gamma), _fmt(index.get((drafter, gamma, "sd", 0.0)))]
        row += [_fmt(index.get((drafter, gamma, "md", b))) for b in budgets]
        if temp > 0:
            md = index.get((drafter, gamma, "md", 0.05))
            row.append("-" if md is None else f"{_over_sd(md):.2f}x")
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""]


def peer_lines(cells) -> list[str]:
    """The greedy HF comparisons (ratios and equality checks from one process each)."""
    out = []
    for c in (c for c in cells if c["mode"] == "hf_ar"):
        ar = c["references"]["ar"]["tok_s"]
        out.append(f"- HF greedy AR {c['tok_s']:.2f} tok/s; engine greedy AR {ar:.2f} tok/s = **{ar / c['tok_s']:.2f}x** "
                   f"HF AR. Engine greedy AR equals HF greedy AR: **{c['identical_to_engine']}**.")
    for c in (c for c in cells if c["mode"] in ("hf_assisted", "hf_lookup")):
        what, ref = ("prompt lookup" if c["mode"] == "hf_lookup" else "assisted"), c["references"]
        out.append(f"- HF {what} ({c['drafter']}, gamma {c['gamma']}): {c['tok_s']:.2f} tok/s = "
                   f"{c['tok_s'] / ref['hf_ar']['tok_s']:.2f}x HF AR; engine greedy SD, same drafter"
                   f"{'' if c['mode'] == 'hf_lookup' else f' and confidence stop {PEER_CONFIDENCE}'}: "
                   f"{ref['engine']['tok_s']:.2f} tok/s = **{ref['engine']['tok_s'] / c['tok_s']:.2f}x** HF {what}. "
                   f"Greedy SD vs HF {what}: token-for-token identical: **{c['identical_to_engine']}**.")
    return out


def summary_lines(cells, temps) -> list[str]:
    """MD (KL 0.05) vs SD win counts and the best configuration per temperature."""
    out = []
    for temp in temps:
        md = [c for c in cells if c["mode"] == "md" and c["temperature"] == temp and c["budget"] == 0.05]
        if md:
            wins = sum(_over_sd(c) > 1 for c in md)
            out.append(f"- MD (KL 0.05) faster than SD (same process) at T={temp}: **{wins} of {len(md)}** "
                       "drafter x gamma pairs.")
        best = max((c for c in cells if c["mode"] in ("sd", "md") and c["temperature"] == temp),
                   key=lambda c: c["speedup_vs_ar"])
        budget = f" KL {best['budget']:g}" if best["mode"] == "md" else ""
        out.append(f"- Best configuration at T={temp}: {best['mode']} {best['drafter']} gamma {best['gamma']}{budget}: "
                   f"**{best['speedup_vs_ar']:.2f}x** engine AR ({best['tok_s']:.2f} tok/s, mean accepted length {_mal(best)}).")
    return out


def md_vs_sd_line(cells) -> str | None:
    """MD (KL 0.05) / SD tok/s over every temperature: wins and geometric mean, in all and per drafter kind."""
    md = [c for c in cells if c["mode"] == "md" and c["budget"] == 0.05]
    if not md:
        return None
    kinds = {}
    for c in sorted(md, key=lambda c: drafter_priority(c["drafter"])):
        kinds.setdefault(parse_drafter(c["drafter"])[0], []).append(_over_sd(c))

    def counts(ratios):
        return (f"faster in {sum(r > 1 for r in ratios)} of {len(ratios)}, "
                f"geometric mean {statistics.geometric_mean(ratios):.3f}x")

    every = [r for ratios in kinds.values() for r in ratios]
    per_kind = "; ".join(f"{kind}: {counts(ratios)}" for kind, ratios in kinds.items())
    return (f"- MD (KL 0.05) / SD tok/s, every temperature: **{counts(every)}** (by drafter kind: {per_kind}); "
            f"lowest {min(every):.2f}x.")


def coverage_line(cells, args) -> str:
    """How much of the generation grid (at the current settings) the cells file holds."""
    grid, have = grid_keys(args), {c["key"] for c in cells}
    remaining = {}
    for key, name in grid.items():
        if key not in have:
            remaining[name] = remaining.get(name, 0) + 1
    at = f"{args.prompts} prompts x {args.new_tokens} tokens, {args.threads} thread(s)"
    full_at = "" if (args.prompts, args.new_tokens) == (10, 64) else " (the generation grid is at 10 x 64)"
    text = f"- Generation grid coverage at {at}{full_at}: **{len(grid) - sum(remaining.values())}/{len(grid)}** cells"
    rest = ", ".join(f"{name} ({n})" for name, n in remaining.items())
    return text + (f"; remaining: {rest}." if rest else "; complete.")


def load_line(cells) -> str:
    """How many cells were measured while other processes shared the cores (from their ``loadavg``)."""
    known = [c for c in cells if c.get("loadavg") is not None or c.get("shards") is not None]
    if not known:
        return "_Machine load was not recorded for these cells._"
    shared = sum((c.get("shards") or 1) > 1 or (c.get("loadavg") or 0) >= 1.5 for c in known)
    return (f"_Load: {shared} of the {len(known)} cells with a recorded load were measured while another process "
            "kept a core busy (grid shards run concurrently, or a 1-minute load >= 1.5 at the chunk's start or "
            "end): their absolute tok/s are lower (memory bandwidth is shared); their ratios are still within one "
            "process"
            + (f"; {len(cells) - len(known)} older cells have no record" if len(known) < len(cells) else "") + "._")


def report(cells: dict[str, dict], args) -> str:
    """The ``generation`` section from every cell of the file at the current settings."""
    settings = settings_of(args)
    mine = [c for c in cells.values() if all(c.get(k) == settings[k] for k in SETTINGS)]
    temps = sorted({c["temperature"] for c in mine if c["mode"] in ("sd", "md")}, reverse=True)
    machines = "; ".join(sorted({c["machine"].strip("_.").removeprefix("Measured on ") for c in mine})) or "-"
    dates = sorted(c["date"] for c in mine)
    lines = [
        "## Generation engine: AR / SD / MD vs Hugging Face `generate`", "",
        f"_{len(mine)} cells from {len({c['run_id'] for c in mine})} process(es)"
        + (f", {dates[0]} to {dates[-1]}" if dates else "") + f"; measured on {machines}._",
        (f"_`bench/generation.py`: target {args.target}, {args.prompts} HumanEval prompts x {args.new_tokens} new "
         f"tokens (EOS stops), batch 1, {args.device}, torch threads {args.threads} (single-threaded timings by "
         f"default), seed {args.seed}. Configs run in chunks (one drafter x one temperature, plus the engine's AR), "
         "interleaved per prompt; every ratio uses references measured in the same process. Table cells: tok/s "
         "speedup vs the engine's AR at the same temperature (mean accepted length); MD 0.05 / SD: tok/s ratio. "
         f"Raw cells: `{args.cells.name}`._"), load_line(mine), "",
    ]
    for temp in temps:
        lines += temperature_table(mine, temp)
    md_line = md_vs_sd_line(mine)
    lines += peer_lines(mine) + summary_lines(mine, temps) + ([md_line] if md_line else []) + [coverage_line(mine, args)]
    if len(mine) < len(cells):
        lines.append(f"- {len(cells) - len(mine)} cells at other settings in `{args.cells.name}` are not shown.")
    return "\n".join(lines)
