"""Speed model for ranking pairs (Leviathan et al. 2023, Thm 3.8 / Cor 3.11), with the measured
costs of the engine's steps (``docs/theory.md``, "Speed model for ranking").

Every cost is in one unit: ``T_ar``, the wall time of one undrafted single-token engine step
(what plain decoding pays per token; :mod:`mdboost.engine.costs` measures all of them in the
engine's own steps). With a mean per-token acceptance ``alpha`` (assumed i.i.d. over
positions), a draft length ``gamma`` and a cost ratio ``c = drafter time per draft token /
T_ar``, one draft-and-verify block costs

    ``gamma c + v(gamma) + s E_solved(alpha, gamma)``

and emits ``E_tokens(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha)`` tokens
(``gamma + 1`` at ``alpha = 1``), so the predicted steady-state speedup over plain decoding is

    ``speedup(alpha, gamma) = E_tokens / (gamma c + v(gamma) + s E_solved)``.

- ``v(K)``: a step verifying ``K`` drafts (the ``K + 1``-token forward, ``q`` at ``K + 1``
  positions, SD's test, the rollback) over ``T_ar``, a table indexed by ``K`` with ``v(0) = 1``
  as measured (not forced monotone: a CPU forward of 4 tokens can cost less than one of 3).
  Without a table ``v = 1``: Leviathan et al.'s model.
- ``s``: the MD solve's extra time per solved position over ``T_ar``; ``0`` for plain SD.
- ``E_solved``: the expected number of positions MD solves per block, by the engine's
  ``md_solve`` mode (:func:`expected_solved`): ``"reached"`` solves every reached position,
  ``sum_{i < gamma} alpha^i = (1 - alpha^gamma) / (1 - alpha)`` (position ``i`` is reached when
  the ``i`` drafts before it were accepted); ``"needed"`` only reached positions whose draft SD
  would reject, a further factor ``1 - alpha_SD`` (SD's test fails with probability
  ``1 - alpha_SD`` independently of the earlier positions); ``"all"``: ``gamma``.

:func:`process_speedup` is the ranking's figure: the same costs summed over the steps the
draft-start process expects on whole generations, plus the prefill of each generation (the
target's, and a model drafter's own), so it predicts what a run of the engine measures
(new tokens over wall time, prompt included).

With ``v = 1`` and ``s = 0`` :func:`walltime_speedup` is exactly
``(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))``. Mentored decoding leaves the per-token
*drafting and verifying* cost of SD unchanged (``docs/theory.md``, "Sampling at (a, b)"); only
``s`` is added. For a drafter that proposes nothing at some positions (prompt-lookup
``ngram``), those positions count as acceptance 0: a block that starts there costs one target
call and yields one token, which is what ``alpha = 0`` gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdboost.md.verify import SOLVE


@dataclass(frozen=True)
class SpeedProfile:
    """Measured verification, MD and prefill costs of a target, in ``T_ar`` (module docstring).

    Attributes
    ----------
    verify_cost : tuple of float or None
        ``v(K)`` for ``K = 0..gamma_max`` (``verify_cost[0] == 1``); ``None``: not measured, ``v = 1``.
    md_overhead : float
        MD solve time per solved position (``s``), for the pair's kind of draft (dense or
        one-hot); applied only at budgets > 0.
    prefill_per_token : float
        The target's prefill cost per prompt token beyond an ordinary step (``beta_t``; 0: not
        modelled).
    verify_samples : tuple of tuple of float or None
        ``verify_samples[K]``: the repeats behind ``verify_cost[K]`` (the speedup intervals draw
        one repeat's table per resample); None: not kept.
    """

    verify_cost: tuple | None = None
    md_overhead: float = 0.0
    prefill_per_token: float = 0.0
    verify_samples: tuple | None = None

    def __post_init__(self):
        if self.verify_cost is not None:
            check_verify_costs(self.verify_cost, 0)
        _check_nonneg("md_overhead", torch.as_tensor(self.md_overhead, dtype=torch.float64))
        _check_nonneg("prefill_per_token", torch.as_tensor(self.prefill_per_token, dtype=torch.float64))


def _check_alpha(alpha: torch.Tensor) -> torch.Tensor:
    alpha = torch.as_tensor(alpha, dtype=torch.float64)
    if torch.isnan(alpha).any() or (alpha < 0).any() or (alpha > 1).any():
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    return alpha


def _check_nonneg(name: str, value) -> torch.Tensor:
    value = torch.as_tensor(value, dtype=torch.float64)
    if torch.isnan(value).any() or torch.isinf(value).any() or (value < 0).any():
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    return value


def _check_gamma(gamma) -> torch.Tensor:
    gamma = torch.as_tensor(gamma, dtype=torch.float64)
    if torch.isnan(gamma).any() or (gamma < 0).any():
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    return gamma


def check_verify_costs(verify_costs, gamma_max: int) -> torch.Tensor:
    """The table ``verify_costs[g]`` (``g = 0..``) as a float64 tensor, checked.

    It must be 1-D, finite, positive, start with 1 (the single-token step itself) and cover
    ``gamma_max``; a ``ValueError`` names ``verify_costs`` otherwise.
    """
    table = torch.as_tensor(verify_costs, dtype=torch.float64)
    if table.ndim != 1 or table.numel() < gamma_max + 1:
        raise ValueError(f"verify_costs must be a 1-D table covering gamma 0..{gamma_max}, got {verify_costs!r}")
    if not torch.isfinite(table).all() or (table <= 0).any() or abs(float(table[0]) - 1.0) > 1e-9:
        raise ValueError(f"verify_costs must be finite, > 0 and start with 1.0, got {verify_costs!r}")
    return table


def expected_tokens(alpha, gamma) -> torch.Tensor:
    """Expected tokens emitted per target call, ``(1 - alpha^(gamma+1)) / (1 - alpha)``.

    Parameters
    ----------
    alpha : float or tensor in [0, 1]
        Mean per-token acceptance probability.
    gamma : int or tensor of ints >= 0
        Draft length (tokens proposed per target call). Broadcasts against ``alpha``.
    """
    alpha = _check_alpha(alpha)
    gamma = _check_gamma(gamma)
    geometric = (1 - alpha ** (gamma + 1)) / (1 - alpha).clamp_min(1e-300)
    return torch.where(alpha >= 1, gamma + 1, geometric)


def expected_solved(alpha, gamma, *, md_solve: str = "reached", sd_acceptance=None) -> torch.Tensor:
    """Expected positions MD solves per block of ``gamma`` drafts (0 at ``gamma = 0``).

    Parameters
    ----------
    alpha : float or tensor in [0, 1]
        MD acceptance.
    gamma : int or tensor >= 0
    md_solve : {"reached", "needed", "all"}, default="reached"
        ``"reached"``: ``sum_{i < gamma} alpha^i``; ``"needed"``: that times
        ``1 - sd_acceptance``; ``"all"``: ``gamma``.
    sd_acceptance : float or tensor in [0, 1], optional
        SD acceptance ``1 - TV(p, q)``; required with ``"needed"``.
    """
    if md_solve not in SOLVE:
        raise ValueError(f"md_solve must be one of {SOLVE}, got {md_solve!r}")
    gamma = _check_gamma(gamma)
    if md_solve == "all":
        return gamma + torch.zeros_like(_check_alpha(alpha))
    reached = torch.where(gamma > 0, expected_tokens(alpha, (gamma - 1).clamp_min(0)), torch.zeros_like(gamma))
    if md_solve == "reached":
        return reached
    if sd_acceptance is None:
        raise ValueError("sd_acceptance is required with md_solve='needed', got None")
    sd = torch.as_tensor(sd_acceptance, dtype=torch.float64)
    if torch.isnan(sd).any() or (sd < 0).any() or (sd > 1).any():
        raise ValueError(f"sd_acceptance must lie in [0, 1], got {sd}")
    return reached * (1 - sd)


def walltime_speedup(alpha, gamma, cost_ratio, *, verify_cost=1.0, md_overhead=0.0, md_solve: str = "reached",
                     sd_acceptance=None) -> torch.Tensor:
    """Predicted walltime speedup ``E_tokens / (gamma c + v + s E_solved)`` over target-only decoding.

    Parameters
    ----------
    alpha : float or tensor in [0, 1]
        Mean per-token acceptance probability.
    gamma : int or tensor >= 0
        Draft length.
    cost_ratio : float or tensor >= 0
        ``c`` = drafter time per draft token / ``T_ar`` (measured).
    verify_cost : float or tensor > 0, default=1.0
        ``v(gamma)``: a step verifying ``gamma`` drafts over an undrafted step (broadcast
        against ``gamma``; 1 is Leviathan et al.'s model).
    md_overhead : float or tensor >= 0, default=0.0
        ``s``: MD solve time per solved position / target step (0 for plain SD).
    md_solve, sd_acceptance : see :func:`expected_solved`.
    """
    c = _check_nonneg("cost_ratio", cost_ratio)
    v = torch.as_tensor(verify_cost, dtype=torch.float64)
    if not torch.isfinite(v).all() or (v <= 0).any():
        raise ValueError(f"verify_cost must be finite and > 0, got {v}")
    s = _check_nonneg("md_overhead", md_overhead)
    gamma_t = _check_gamma(gamma)
    solved = expected_solved(alpha, gamma, md_solve=md_solve, sd_acceptance=sd_acceptance)
    return expected_tokens(alpha, gamma) / (gamma_t * c + v + s * solved)


def gamma_speedups(alpha, cost_ratio, gamma_min: int = 1, gamma_max: int = 8, *, verify_costs=None,
                   md_overhead=0.0, md_solve: str = "reached", sd_acceptance=None) -> torch.Tensor:
    """:func:`walltime_speedup` at every draft length ``gamma_min..gamma_max`` (last axis).

    Parameters as in :func:`best_gamma`.

    Returns
    -------
    float64 tensor [..., G], ``G = gamma_max - gamma_min + 1``
    """
    if int(gamma_min) != gamma_min or int(gamma_max) != gamma_max or not 1 <= gamma_min <= gamma_max:
        raise ValueError(f"gamma range must satisfy 1 <= gamma_min <= gamma_max, got {(gamma_min, gamma_max)}")
    alpha = _check_alpha(alpha)
    c = _check_nonneg("cost_ratio", cost_ratio)
    s = _check_nonneg("md_overhead", md_overhead)
    sd = torch.zeros(()) if sd_acceptance is None else torch.as_tensor(sd_acceptance, dtype=torch.float64)
    alpha, c, s, sd = torch.broadcast_tensors(alpha, c, s, sd)
    gammas = torch.arange(gamma_min, gamma_max + 1, dtype=torch.float64)  # [G]
    v = torch.ones_like(gammas) if verify_costs is None else check_verify_costs(verify_costs, gamma_max)[gamma_min:gamma_max + 1]
    return walltime_speedup(alpha.unsqueeze(-1), gammas, c.unsqueeze(-1), verify_cost=v,
                            md_overhead=s.unsqueeze(-1), md_solve=md_solve,
                            sd_acceptance=None if sd_acceptance is None else sd.unsqueeze(-1))  # [..., G]


def best_gamma(alpha, cost_ratio, gamma_min: int = 1, gamma_max: int = 8, *, verify_costs=None,
               md_overhead=0.0, md_solve: str = "reached", sd_acceptance=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft length in ``[gamma_min, gamma_max]`` that maximizes :func:`walltime_speedup`.

    Parameters
    ----------
    alpha : float or tensor [...] in [0, 1]
    cost_ratio : float or tensor [...] >= 0 (broadcast against ``alpha``)
    gamma_min, gamma_max : int
        Search range, ``1 <= gamma_min <= gamma_max``. Ties go to the smallest gamma.
    verify_costs : sequence of float, optional
        ``v`` table indexed by gamma (``verify_costs[0] == 1``, covering ``gamma_max``); default:
        ``v = 1`` for every gamma.
    md_overhead : float or tensor [...] >= 0, default=0.0
        ``s`` (0 for plain SD).
    md_solve : {"reached", "needed", "all"}, default="reached"
    sd_acceptance : float or tensor [...] in [0, 1], optional
        Required with ``md_solve="needed"`` (see :func:`expected_solved`).

    Returns
    -------
    gamma : LongTensor [...]
    speedup : float64 tensor [...]
        The speedup at that gamma (may be below 1: speculation would not pay off).
    """
    speed = gamma_speedups(alpha, cost_ratio, gamma_min, gamma_max, verify_costs=verify_costs,
                           md_overhead=md_overhead, md_solve=md_solve, sd_acceptance=sd_acceptance)
    best = speed.argmax(dim=-1)  # first maximum: the smallest gamma on ties
    return best + gamma_min, speed.gather(-1, best.unsqueeze(-1)).squeeze(-1)


def process_speedup(tokens, draft_tokens, steps_by_draft_len, cost_ratio, *, verify_costs=None, md_overhead=0.0,
                    solved=0.0, prefill=0.0, drafter_prefill=0.0) -> torch.Tensor:
    """Walltime speedup of whole generations from the draft-start process (:mod:`mdboost.ranking.process`).

    The same costs as :func:`walltime_speedup`, summed over the steps the process expects
    instead of one i.i.d. block (an undrafted step costs ``v(0) = 1``; steps near the end draft
    fewer tokens), plus the generations' prefill:

        ``(tokens + prefill) / (c draft_tokens + sum_K v(K) steps_K + s solved + prefill + drafter_prefill)``

    where plain decoding takes ``tokens`` steps and ``prefill`` more (the target's first step
    feeds the prompt: ``beta_t (L - 1)`` beyond an ordinary step for a prompt of ``L`` tokens,
    the same for speculative decoding, whose first verification feeds it), and a drafter with a
    model drafter feeds the prompt once more at its first proposal (``drafter_prefill =
    beta_d (L - 1)``; prompt lookup: 0).

    Parameters
    ----------
    tokens : float or tensor [...]
        Tokens emitted.
    draft_tokens : float or tensor [...]
        Expected drafter forwards, each costing ``c``: the drafted tokens, plus one per step a
        draft floor ended (``ProcessResult.drafter_forwards``: the forward whose confidence was
        below the floor drafts nothing but is paid).
    steps_by_draft_len : tensor [..., G + 1]
        Expected steps with ``K = 0..G`` drafts.
    cost_ratio : float or tensor [...] >= 0
    verify_costs : sequence of float or tensor [..., G' + 1], optional
        ``v`` table covering ``G`` (default ``v = 1``); a tensor of tables broadcasts against
        ``steps_by_draft_len`` (e.g. one table per bootstrap resample).
    md_overhead : float or tensor [...] >= 0
        ``s`` (0 for plain SD).
    solved : float or tensor [...] >= 0
        Expected positions MD solves (the process's reached, needed or all positions).
    prefill, drafter_prefill : float or tensor [...] >= 0
        The target's and the drafter's prefill beyond an ordinary step, summed over the
        generations (``T_ar``; default 0: steady state, prompts not counted).

    Examples
    --------
    Ten tokens, five steps of one draft each (``v(1) = 1.5``) with ``c = 0.2``, and a prefill of
    3 steps: ``(10 + 3) / (0.2 * 5 + 1.5 * 5 + 3) = 13 / 11.5``.

    >>> round(float(process_speedup(10.0, 5.0, torch.tensor([0.0, 5.0]), 0.2, verify_costs=[1.0, 1.5],
    ...                             prefill=3.0)), 4)
    1.1304
    """
    hist = torch.as_tensor(steps_by_draft_len, dtype=torch.float64)
    g = hist.shape[-1] - 1
    if verify_costs is None:
        v = torch.ones(g + 1, dtype=torch.float64)
    elif torch.is_tensor(verify_costs) and verify_costs.ndim > 1:
        v = verify_costs.double()[..., :g + 1]
        if v.shape[-1] < g + 1 or not torch.isfinite(v).all() or (v <= 0).any() or (v[..., 0] != 1).any():
            raise ValueError(f"verify_costs tables must cover gamma 0..{g}, be finite, > 0 and start with 1.0")
    else:
        v = check_verify_costs(verify_costs, g)[:g + 1]
    c = _check_nonneg("cost_ratio", cost_ratio)
    s = _check_nonneg("md_overhead", md_overhead)
    solved = _check_nonneg("solved", solved)
    draft_tokens = _check_nonneg("draft_tokens", draft_tokens)
    prefill = _check_nonneg("prefill", prefill)
    drafter_prefill = _check_nonneg("drafter_prefill", drafter_prefill)
    time = c * draft_tokens + (hist * v).sum(-1) + s * solved + prefill + drafter_prefill
    return (torch.as_tensor(tokens, dtype=torch.float64) + prefill) / time


def alone_speedup(tokens, cost_ratio, *, prefill=0.0, drafter_prefill=0.0) -> torch.Tensor:
    """Walltime speedup of plain decoding with the drafter alone over plain decoding with the target.

    The drafter alone is mentored decoding at an unbounded budget: every token is the drafter's
    own (``docs/theory.md``, "Degenerate budgets"). It pays one drafter step per token, ``c``
    in ``T_ar`` (a model drafter's measured cost ratio), and feeds the prompt once at its own
    prefill cost:

        ``(tokens + prefill) / (c tokens + drafter_prefill)``

    with ``prefill`` and ``drafter_prefill`` the target's and the drafter's prefill beyond an
    ordinary step (:func:`process_speedup`). Without prefill it is ``1 / c``.

    >>> round(float(alone_speedup(10.0, 0.5)), 6), round(float(alone_speedup(10.0, 0.5, prefill=2.0, drafter_prefill=1.0)), 6)
    (2.0, 2.0)
    """
    c = _check_nonneg("cost_ratio", cost_ratio)
    tokens = _check_nonneg("tokens", tokens)
    prefill = _check_nonneg("prefill", prefill)
    drafter_prefill = _check_nonneg("drafter_prefill", drafter_prefill)
    if (c == 0).any():
        raise ValueError(f"cost_ratio must be > 0 for a drafter decoding alone, got {cost_ratio!r}")
    return (tokens + prefill) / (c * tokens + drafter_prefill)
