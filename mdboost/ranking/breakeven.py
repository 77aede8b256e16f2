"""Where a pick depends on the hardware: each drafter's break-even cost (``docs/theory.md``
section 8, "Break-even drafter cost"; ``docs/ranking.md``, "Break-even costs").

A ranking's speedups hold for the costs it was given, and the drafter's cost ratio ``c`` (its
step over a target step) is what moves most between machines: the int8 drafter costs 0.36 of a
target step on a CPU with VNNI and 0.645 on one without. The speed model's inverse speedup is
linear in a factor ``lambda`` on the drafter's costs (its ``c`` and its prefill, ``docs/theory.md``
section 8): with ``s1`` a row's predicted speedup and ``s0`` the same with the drafter's costs
at 0 (the ``speedup_free_drafter`` column),

    ``1 / s(lambda) = 1 / s0 + lambda (1 / s1 - 1 / s0)``,

so the cost at which the row reaches a speedup ``S`` is ``c lambda_S`` with
``lambda_S = (1 / S - 1 / s0) / (1 / s1 - 1 / s0)``. Over a drafter's eligible rows (every
point and gamma) the largest such cost is the drafter's break-even: below it some operating
point of the drafter reaches ``S`` (the other costs, ``v(K)`` and ``s``, as measured). Speedups are
the point estimates, not the interval bounds the verdict's "reliably faster" reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from mdboost.ranking.report import csv_bool, csv_float


def break_even_cost(speedup: float, free_speedup: float, cost_ratio: float, target: float) -> float:
    """The drafter cost ratio at which a row's speedup is ``target`` (module docstring).

    ``inf`` when the row reaches ``target`` whatever the drafter costs (no drafter cost in its
    time), ``0`` when it does not reach it even with a free drafter, NaN when a speedup is not
    a positive number.

    >>> round(break_even_cost(0.8, 1.6, 0.5, 1.0), 6)  # 1/s = 0.625 + lambda 0.625: s = 1 at lambda = 0.6
    0.3
    >>> break_even_cost(0.9, 0.95, 0.5, 1.0)  # even a free drafter stays below 1
    0.0
    """
    for name, value in (("speedup", speedup), ("free_speedup", free_speedup), ("cost_ratio", cost_ratio),
                        ("target", target)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {value!r}")
    if not (speedup > 0 and free_speedup > 0 and target > 0 and cost_ratio >= 0):
        return math.nan
    u0, u1, want = 1 / free_speedup, 1 / speedup, 1 / target
    if want < u0:
        return 0.0
    if u1 <= u0 or cost_ratio == 0:
        return math.inf
    return cost_ratio * (want - u0) / (u1 - u0)


def break_even_costs(rows: Sequence[Mapping], pick_speedup: float | None = None) -> dict:
    """Per drafter: its ``cost_ratio``, the cost below which it pays (``pays_below``: some eligible
    row reaches a speedup of 1) and, given the pick's predicted speedup, the cost below which it
    would reach the pick (``overtakes_pick_below``, None without a pick). Rows: one batch size's
    ranking rows (``quality_ok`` set; all rows when none is eligible), with the
    ``speedup_free_drafter`` column (rows without it are skipped).

    >>> rows = [{"drafter": "int8", "cost_ratio": "0.5", "predicted_speedup": "0.8", "speedup_free_drafter": "1.6",
    ...          "quality_ok": "True"}]
    >>> out = break_even_costs(rows, pick_speedup=1.2)["int8"]
    >>> round(out["pays_below"], 6), round(out["overtakes_pick_below"], 6)
    (0.3, 0.166667)
    """
    eligible = [r for r in rows if csv_bool(r.get("quality_ok"))] or list(rows)
    out: dict = {}
    for row in eligible:
        s1, s0, c = (csv_float(row.get(k)) for k in ("predicted_speedup", "speedup_free_drafter", "cost_ratio"))
        if not all(math.isfinite(x) for x in (s1, s0, c)):
            continue
        entry = out.setdefault(str(row["drafter"]), {"cost_ratio": c, "pays_below": 0.0,
                                                     "overtakes_pick_below": None if pick_speedup is None else 0.0})
        entry["pays_below"] = max(entry["pays_below"], break_even_cost(s1, s0, c, 1.0))
        if pick_speedup is not None:
            entry["overtakes_pick_below"] = max(entry["overtakes_pick_below"], break_even_cost(s1, s0, c, pick_speedup))
    return out


def _cost(x: float) -> str:
    return "any cost" if math.isinf(x) else f"{x:.3g}"


def hardware_line(costs: Mapping, pick: str | None, *, limit: int = 3) -> str:
    """One line on what the pick depends on, from :func:`break_even_costs`.

    With a pick (the recommended drafter): up to which cost it pays, and the drafters that would
    overtake it at a lower cost than theirs here, the nearest first (the largest break-even over
    cost), at most ``limit``. Without (plain decoding wins): the drafters that would pay at a
    lower cost than theirs here.

    >>> costs = {"ngram:3": {"cost_ratio": 0.002, "pays_below": 0.4, "overtakes_pick_below": 0.002},
    ...          "int8": {"cost_ratio": 0.585, "pays_below": 0.7, "overtakes_pick_below": 0.45}}
    >>> hardware_line(costs, "ngram:3")
    'the pick pays while ngram:3 costs below 0.4 of a target step (0.002 here); int8 would overtake it below 0.45 (0.585 here)'
    >>> hardware_line({"int8": {"cost_ratio": 0.645, "pays_below": 0.5, "overtakes_pick_below": None}}, None)
    'at lower drafter costs: int8 would pay below 0.5 of a target step (0.645 here)'
    """
    def near(key: str, skip=None) -> list:
        found = [(d, e) for d, e in costs.items() if d != skip and e.get(key) is not None
                 and 0 < e[key] and (e["cost_ratio"] == 0 or e[key] < e["cost_ratio"])]
        # nearest first: the smallest cut from today's cost (a free drafter last)
        return sorted(found, key=lambda de: -de[1][key] / de[1]["cost_ratio"] if de[1]["cost_ratio"] else 0.0)[:limit]

    if pick is not None and pick in costs:
        own = costs[pick]
        head = f"the pick pays while {pick} costs below {_cost(own['pays_below'])} of a target step ({own['cost_ratio']:.3g} here)"
        rivals = near("overtakes_pick_below", pick)
        if not rivals:
            return f"{head}; no other drafter would overtake it at any lower cost"
        return head + "; " + ", ".join(f"{d} would overtake it below {_cost(e['overtakes_pick_below'])} "
                                       f"({e['cost_ratio']:.3g} here)" for d, e in rivals)
    rivals = near("pays_below")
    if not rivals:
        return "no drafter would pay at a lower cost than its own here"
    (first, e0), rest = rivals[0], rivals[1:]
    parts = [f"{first} would pay below {_cost(e0['pays_below'])} of a target step ({e0['cost_ratio']:.3g} here)"]
    parts += [f"{d} below {_cost(e['pays_below'])} ({e['cost_ratio']:.3g} here)" for d, e in rest]
    return "at lower drafter costs: " + ", ".join(parts)


def reason_line(row: Mapping) -> str:
    """Why a point is as fast as it is, from what was measured: the tokens one target call makes
    at its gamma (undrafted calls included) against what a drafted call costs in target steps
    (verifying ``gamma + 1`` tokens, ``v(gamma)``, plus drafting ``gamma`` tokens at ``c`` each,
    plus MD's solve ``s`` where the point is lossy), and for a drafter that does not always
    propose (prompt lookup) how often it does. The speed model (``docs/theory.md`` section 8) adds the draft-start
    process and the prefill; this line is its steady state in words. ``row``: a ranking row (CSV
    strings or numbers) with ``engine_tokens_per_call`` (else ``engine_mean_accepted_length``),
    ``engine_acceptance``, ``cost_ratio``, ``verify_cost``, ``md_overhead``, ``gamma`` and
    ``proposal_rate``.

    >>> row = {"drafter": "int8", "gamma": "3", "engine_tokens_per_call": "2.9", "engine_acceptance": "0.79",
    ...        "cost_ratio": "0.6", "verify_cost": "1.2", "md_overhead": "0.05", "max_divergence": "0.2"}
    >>> reason_line(row)
    'int8 at gamma 3 makes 2.90 tokens per target call (0.79 of its drafts accepted); a drafted call costs 3.05 target steps: verifying 4 tokens 1.20, drafting 3 x 0.6, solving MD 0.05'
    >>> reason_line({"drafter": "ngram:3", "gamma": 1, "engine_tokens_per_call": 1.4, "engine_acceptance": 0.41,
    ...              "cost_ratio": 0.006, "verify_cost": 1.7, "md_overhead": 0.0, "max_divergence": 0.0,
    ...              "proposal_rate": 0.55})
    'ngram:3 at gamma 1 makes 1.40 tokens per target call (0.41 of its drafts accepted; it drafts at 55% of positions); a drafted call costs 1.71 target steps: verifying 2 tokens 1.70, drafting 1 x 0.006'
    """
    gamma = int(csv_float(row.get("gamma")))
    tokens = csv_float(row.get("engine_tokens_per_call"))
    if not math.isfinite(tokens):
        tokens = csv_float(row.get("engine_mean_accepted_length"))
    acceptance, c, verify, solve = (csv_float(row.get(k)) for k in ("engine_acceptance", "cost_ratio", "verify_cost",
                                                                     "md_overhead"))
    verify = verify if math.isfinite(verify) else 1.0
    lossy = csv_float(row.get("max_divergence")) > 0 and math.isfinite(solve) and solve > 0
    total = verify + gamma * c + (solve if lossy else 0.0)
    parts = [f"verifying {gamma + 1} tokens {verify:.2f}", f"drafting {gamma} x {c:.3g}"]
    if lossy:
        parts.append(f"solving MD {solve:.2f}")
    rate = csv_float(row.get("proposal_rate"))
    notes = ([f"{acceptance:.2f} of its drafts accepted"] if math.isfinite(acceptance) else []) + (
        [f"it drafts at {rate:.0%} of positions"] if math.isfinite(rate) and rate < 1 else [])
    noted = f" ({'; '.join(notes)})" if notes else ""
    return (f"{row['drafter']} at gamma {gamma} makes {tokens:.2f} tokens per target call{noted}; a drafted call "
            f"costs {total:.2f} target steps: {', '.join(parts)}")
