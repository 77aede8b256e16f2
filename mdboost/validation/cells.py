"""Which cells of a ranking to validate, and with which sampling settings.

A *cell* is one row of ``ranking.csv``: (drafter, target, temperature, divergence, budget
``max_divergence``, gamma) with its predictions. Validation runs a few of them for real; this
module picks them and checks that the validation's own sampling settings do not contradict the
ranking's (a prediction made at ``T = 0.7`` says nothing about a run at ``T = 1``).

The selection rule (:func:`select_cells`, documented in ``docs/validation.md``, "Which cells"):

1. candidates are the rows of every rule (``docs/ranking.md``, "Rules and engines": the engine
   runs each with its drafting, :mod:`mdboost.md.rules`) whose target can verify (not an n-gram
   member), with a finite predicted speedup, drafting somewhere (a row whose draft-start process
   predicts no drafted step, ``engine_acceptance`` NaN: a draft floor above every confidence,
   has no acceptance to realize), at one of the allowed temperatures; a budget-0 row
   is lossless, so its divergence does not matter (it counts once per (pair, temperature, gamma,
   rule, drafting, draft floor));
2. the first cell is the recommendation's row (the ranking's, or
   :func:`mdboost.ranking.recommend.recommend` over the candidates when none is given or when
   it lies outside the candidates, e.g. at a temperature left out);
3. then, one at a time, the candidate whose values are least used so far, compared in this
   order: its temperature's count among the chosen cells, the count of its (temperature, budget
   class) pair (class: budget 0 or > 0), the count of its rule (name, drafting, floor), whether it
   fails the quality check (``quality_ok`` rows first), and the summed counts of its drafter,
   gamma, budget and divergence; ties go to the better ``rank``, then to the row order.

Step 3 spreads the cells round-robin over temperatures, and within each over lossless / lossy,
then over rules, drafters, gammas and budgets, without duplicates; the same rows always give the
same cells.

Rows are ``ranking.csv`` rows as read back (strings) or dicts of numbers: this module reads
them, nothing else.
"""

from __future__ import annotations

import math

from mdboost.ranking.recommend import recommend
from mdboost.ranking.report import csv_bool, csv_float, row_batch_size, row_draft_p_min

SAMPLING_KEYS = ("temperature", "top_k", "top_p")


def _optional(value):
    """``None`` for missing / empty / ``"None"`` CSV or YAML values, else the value."""
    return None if value is None or str(value).strip() in ("", "None", "null") else value


def cell_key(row: dict) -> tuple:
    """``(drafter, target, temperature, divergence, max_divergence, gamma, rule, drafting, draft_p_min,
    batch_size)`` of a row.

    A budget-0 row is lossless: its divergence is ``"none"`` whatever the row says. A row
    without ``rule`` / ``drafting`` (a ranking from before rules were ranked) is MD on sampled
    drafts, one without ``draft_p_min`` has no draft floor, one without ``batch_size`` is for
    batch size 1.

    >>> cell_key({"drafter": "a", "target": "t", "temperature": "0.7", "divergence": "kl",
    ...           "max_divergence": "0.0", "gamma": "3"})
    ('a', 't', 0.7, 'none', 0.0, 3, 'mentored', 'sampled', 0.0, 1)
    """
    budget = round(csv_float(row["max_divergence"]), 12)
    divergence = "none" if budget == 0 else str(row["divergence"])
    return (str(row["drafter"]), str(row["target"]), round(csv_float(row["temperature"]), 12), divergence, budget,
            int(csv_float(row["gamma"])), str(row.get("rule") or "mentored"), str(row.get("drafting") or "sampled"),
            row_draft_p_min(row), row_batch_size(row))


def complete_rows(rows: list[dict], *, temperature: float | None, md_solve: str) -> list[dict]:
    """Copies of ranking rows with ``temperature``, ``gamma`` and ``md_solve`` filled in.

    Rankings from before per-gamma rows have one row per operating point at its ``best_gamma``
    and a single temperature (the ranking's ``md.temperature``): such rows get
    ``gamma = best_gamma``, ``temperature`` (``None``: a row without one is an error) and the
    ranking's ``md_solve``. Present values are kept.
    """
    out = []
    for r in rows:
        r = dict(r)
        if _optional(r.get("gamma")) is None:
            if _optional(r.get("best_gamma")) is None:
                raise ValueError(f"row must hold gamma or best_gamma, got keys {sorted(r)}")
            r["gamma"] = r["best_gamma"]
        if _optional(r.get("temperature")) is None:
            if temperature is None:
                raise ValueError("row has no temperature and the ranking has several, got temperature=None")
            r["temperature"] = temperature
        if _optional(r.get("md_solve")) is None:
            r["md_solve"] = md_solve
        out.append(r)
    return out


def resolve_sampling(ranking: dict, *, temperature: float | None = None, top_k: int | None = None,
                     top_p: float | None = None) -> dict:
    """The sampling settings to validate with: the ranking's, checked against the validation's own.

    Parameters
    ----------
    ranking : dict
        The ranking's settings: ``temperatures`` (list of floats, ``>= 0``), ``top_k``
        (int or None) and ``top_p`` (float or None), as in the ranking's ``summary.json``
        key ``sampling``.
    temperature : float or None
        ``None`` validates at every temperature of the ranking; a value validates only at that
        temperature, which must be one the ranking predicted for.
    top_k, top_p : int or None, float or None
        ``None`` takes the ranking's; a value must equal the ranking's.

    Returns
    -------
    dict
        ``{"temperatures": [...], "top_k": ..., "top_p": ...}``.

    Raises
    ------
    ValueError
        When a given setting contradicts the ranking's; the message names the key and both
        values.

    Examples
    --------
    >>> resolve_sampling({"temperatures": [0.7, 1.0], "top_k": None, "top_p": None}, temperature=1.0)
    {'temperatures': [1.0], 'top_k': None, 'top_p': None}
    >>> resolve_sampling({"temperatures": [0.5], "top_k": None, "top_p": None}, temperature=1.0)
    Traceback (most recent call last):
    ...
    ValueError: generation.temperature is 1.0 but the ranking predicts at temperature 0.5: validating at another temperature would count the difference as prediction error (set generation.temperature to null to take the ranking's)
    """
    temps = [float(t) for t in ranking.get("temperatures") or []]
    if not temps or any(not (math.isfinite(t) and t >= 0) for t in temps):
        raise ValueError(f"ranking temperatures must be a non-empty list of numbers >= 0, got {ranking.get('temperatures')!r}")
    rk, rp = _optional(ranking.get("top_k")), _optional(ranking.get("top_p"))
    rk = None if rk is None else int(rk)
    rp = None if rp is None else float(rp)
    if temperature is not None and not any(math.isclose(float(temperature), t, abs_tol=1e-9) for t in temps):
        shown = f"temperature {temps[0]}" if len(temps) == 1 else f"temperatures {temps}"
        raise ValueError(f"generation.temperature is {float(temperature)} but the ranking predicts at {shown}: "
                         "validating at another temperature would count the difference as prediction error "
                         "(set generation.temperature to null to take the ranking's)")
    for key, mine, theirs in (("top_k", top_k, rk), ("top_p", top_p, rp)):
        if mine is not None and (theirs is None or not math.isclose(float(mine), float(theirs), abs_tol=1e-12)):
            raise ValueError(f"generation.{key} is {mine!r} but the ranking predicts with {key} {theirs!r} "
                             f"(set generation.{key} to null to take the ranking's)")
    chosen = temps if temperature is None else [t for t in temps if math.isclose(float(temperature), t, abs_tol=1e-9)]
    return {"temperatures": chosen, "top_k": rk, "top_p": rp}


def check_md_solve(rows: list[dict], md_solve: str | None) -> None:
    """Refuse a validation ``md_solve`` that differs from the one the ranking's speed model assumed.

    ``md_solve`` ``None`` takes the rows' (column ``md_solve``, see :func:`complete_rows`).
    """
    theirs = sorted({str(r["md_solve"]) for r in rows})
    if md_solve is not None and theirs != [md_solve]:
        raise ValueError(f"generation.md_solve is {md_solve!r} but the ranking predicts for md_solve "
                         f"{theirs[0] if len(theirs) == 1 else theirs!r} (set generation.md_solve to null to take the ranking's)")


def _is_candidate(row: dict, temperatures) -> bool:
    target = str(row["target"])
    if target == "ngram" or target.startswith("ngram:"):
        return False
    if not math.isfinite(csv_float(row.get("predicted_speedup"))):
        return False
    if math.isnan(csv_float(row.get("engine_acceptance"))) and math.isfinite(csv_float(row.get("engine_tokens_per_call"))):
        return False  # the process ran and predicts no drafted step (a draft floor above every confidence)
    return temperatures is None or any(math.isclose(csv_float(row["temperature"]), float(t), abs_tol=1e-9)
                                       for t in temperatures)


def _recommended_index(rows: list[dict], recommendation: dict | None) -> int:
    """Index of the recommendation's row among ``rows``; recomputed over them when absent."""
    keys = [cell_key(r) for r in rows]
    size = {"batch_size": row_batch_size(rows[0])}  # a recommendation names no batch size: the rows'
    if recommendation is not None and cell_key({**size, **recommendation}) in keys:
        return keys.index(cell_key({**size, **recommendation}))
    return keys.index(cell_key({**recommend(rows).to_dict(), **size}))


def select_cells(rows: list[dict], recommendation: dict | None = None, *, cells: int = 12,
                 temperatures=None) -> list[dict]:
    """The recommendation's row, then ``cells`` further rows spread over the space (module rule).

    Parameters
    ----------
    rows : list of dict
        Ranking rows with ``drafter``, ``target``, ``temperature``, ``divergence``,
        ``max_divergence``, ``gamma``, ``predicted_speedup``, ``rank`` and ``quality_ok``
        (see :func:`complete_rows` for older rankings).
    recommendation : dict or None
        The ranking's ``summary.json`` ``recommendation`` (its cell fields are used); ``None``,
        or one outside the candidates, is recomputed with
        :func:`mdboost.ranking.recommend.recommend` over the candidates.
    cells : int
        Further cells after the recommendation (``>= 0``); fewer when the ranking has fewer.
    temperatures : sequence of float or None
        Only rows at these temperatures (``None``: all).

    Returns
    -------
    list of dict
        The chosen rows, the recommendation's first.
    """
    if not isinstance(cells, int) or isinstance(cells, bool) or cells < 0:
        raise ValueError(f"cells must be an integer >= 0, got {cells!r}")
    unique, seen = [], set()
    for r in rows:
        key = cell_key(r)
        if _is_candidate(r, temperatures) and key not in seen:
            seen.add(key)
            unique.append(r)
    if not unique:
        raise ValueError(f"rows hold no cell to validate (at temperatures {temperatures}, target not an n-gram, "
                         f"finite predicted_speedup), got {len(rows)} rows")
    chosen = [_recommended_index(unique, recommendation)]
    counts: dict[tuple, int] = {}

    def add(row: dict) -> None:
        for dim_value in _dimensions(row):
            counts[dim_value] = counts.get(dim_value, 0) + 1

    add(unique[chosen[0]])
    remaining = [i for i in range(len(unique)) if i != chosen[0]]
    while remaining and len(chosen) < cells + 1:
        best = min(remaining, key=lambda i: _novelty(unique[i], counts, i))
        chosen.append(best)
        remaining.remove(best)
        add(unique[best])
    return [unique[i] for i in chosen]


def _dimensions(row: dict) -> list[tuple]:
    _, _, temperature, divergence, budget, gamma, rule, drafting, floor, _ = cell_key(row)
    return [("temperature", temperature), ("class", temperature, budget > 0), ("rule", rule, drafting, floor),
            ("drafter", str(row["drafter"])), ("gamma", gamma), ("budget", budget), ("divergence", divergence)]


def _novelty(row: dict, counts: dict, index: int) -> tuple:
    t, cls, rule, *rest = (counts.get(d, 0) for d in _dimensions(row))
    rank = csv_float(row.get("rank"), math.inf)
    return t, cls, rule, not csv_bool(row.get("quality_ok")), sum(rest), rank, index
