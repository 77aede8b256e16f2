"""Generation statistics in vLLM's vocabulary, plus mentored decoding's lossy counters.

Plain dataclasses: the engine fills them, pipelines log them (nothing is logged here).

Definitions (counted over rows that are still generating; a "draft" is one row's proposal of
at least one token in one engine step; a position counts only if the row emits its token, so
drafts that EOS, ``max_new_tokens`` or a stopping criterion discard are not counted anywhere):

- ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens`` (accepted draft tokens, not
  counting the target's correction/bonus token);
- ``acceptance_rate_per_position[j]``: accepted / proposed draft tokens at draft position j;
- ``mean_accepted_length = 1 + num_accepted_tokens / num_drafts``: tokens emitted per target
  call on drafted steps (vLLM's "mean acceptance length", bonus token included);
- ``mean_divergence`` / ``max_divergence``: realized ``D_f(pi || q)`` of the distribution each
  verified position actually sampled from (0 for standard SD), over the verified positions
  where the clamp was solved (``num_solved_positions``: all of them with ``md_solve="reached"``;
  with the default ``"needed"`` only the drafts SD would have rejected);
- ``acceptance_probability_sum_per_position[j]`` / ``acceptance_probability_count_per_position[j]``:
  sum and count of verify's acceptance probability ``P_acc(pi)`` (``1 - TV(p, q)`` for SD) at
  draft position ``j`` over the steps where it was computed; at ``j = 0`` with every position
  solved it is a low-variance (Rao-Blackwellized) estimate of the position-0 acceptance rate;
- ``budget_utilization = mean_divergence / budget`` (``None`` without a budget);
- ``num_budget_accepted``: accepted tokens that standard SD would have rejected with the same
  uniform draw (``u >= q_x / p_x`` but ``u < (1 + a) q_x / p_x``);
- timing: wall seconds in the drafter, the target forward and ``verify`` (on CUDA the device
  is synchronized only at these split boundaries), over the whole call, and of its first
  step (``time_first_step``: from the call's start to the end of the step that feeds the
  prompt, opening the cache and the drafter included).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    """Counters of one :func:`mdboost.engine.generate` call (see the module docstring)."""

    mode: str = "ar"
    num_new_tokens: int = 0
    num_target_calls: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    draft_tokens_per_position: list[int] = field(default_factory=list)
    accepted_tokens_per_position: list[int] = field(default_factory=list)
    budget: float | None = None
    num_verified_positions: int = 0
    num_solved_positions: int = 0
    acceptance_probability_sum_per_position: list[float] = field(default_factory=list)
    acceptance_probability_count_per_position: list[int] = field(default_factory=list)
    divergence_sum: float = 0.0
    max_divergence: float = 0.0
    num_budget_accepted: int = 0
    time_drafter: float = 0.0
    time_target: float = 0.0
    time_verify: float = 0.0
    time_total: float = 0.0
    time_first_step: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens over all positions (``nan`` without drafts)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else float("nan")

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """Accepted / proposed draft tokens at each draft position."""
        return [a / d if d else float("nan") for a, d in zip(self.accepted_tokens_per_position, self.draft_tokens_per_position)]

    @property
    def mean_accepted_length(self) -> float:
        """``1 + accepted / drafts``: tokens per target call on drafted steps."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def mean_divergence(self) -> float:
        """Mean realized ``D_f(pi || q)`` over the solved verified positions."""
        return self.divergence_sum / self.num_solved_positions if self.num_solved_positions else 0.0

    @property
    def expected_acceptance_per_position(self) -> list[float]:
        """Mean ``P_acc(pi)`` at each draft position over the steps where it was computed."""
        return [s / n if n else float("nan") for s, n in zip(self.acceptance_probability_sum_per_position,
                                                             self.acceptance_probability_count_per_position)]

    def add_acceptance_probabilities(self, probs: list[float]) -> None:
        """Add one row's per-position acceptance probabilities (NaN = not computed, skipped)."""
        grow = len(probs) - len(self.acceptance_probability_sum_per_position)
        if grow > 0:
            self.acceptance_probability_sum_per_position += [0.0] * grow
            self.acceptance_probability_count_per_position += [0] * grow
        for j, value in enumerate(probs):
            if value == value:
                self.acceptance_probability_sum_per_position[j] += value
                self.acceptance_probability_count_per_position[j] += 1

    def add_verified(self, divergences: list[float], acceptance_probs: list[float], budget_accepted: int = 0) -> None:
        """Add one row's verified positions of one step.

        ``divergences[j]``: realized ``D_f(pi || q)`` at the row's ``j``-th verified position
        (NaN where the clamp was not solved); ``acceptance_probs[j]``: its ``P_acc(pi)`` (NaN
        where not computed); ``budget_accepted``: the row's tokens accepted only thanks to the budget.
        """
        if len(divergences) != len(acceptance_probs):
            raise ValueError(f"divergences and acceptance_probs must have one entry per verified position, "
                             f"got {len(divergences)} and {len(acceptance_probs)}")
        solved = [d for d in divergences if d == d]
        self.num_verified_positions += len(divergences)
        self.num_solved_positions += len(solved)
        self.divergence_sum += sum(solved)
        self.max_divergence = max([self.max_divergence] + solved)
        self.num_budget_accepted += int(budget_accepted)
        self.add_acceptance_probabilities(acceptance_probs)

    @property
    def budget_utilization(self) -> float | None:
        """``mean_divergence / budget``; ``None`` when there is no positive budget."""
        return self.mean_divergence / self.budget if self.budget else None

    @property
    def tokens_per_second(self) -> float:
        """New tokens (all rows) per wall second of the whole call."""
        return self.num_new_tokens / self.time_total if self.time_total else float("nan")

    def add_position_counts(self, drafted: list[int], accepted: list[int]) -> None:
        """Add per-row draft lengths and accepted counts to the per-position histograms."""
        width = max(drafted, default=0)
        grow = width - len(self.draft_tokens_per_position)
        if grow > 0:
            self.draft_tokens_per_position += [0] * grow
            self.accepted_tokens_per_position += [0] * grow
        for k, n in zip(drafted, accepted):
            for j in range(k):
                self.draft_tokens_per_position[j] += 1
                self.accepted_tokens_per_position[j] += int(j < n)
        self.num_drafts += sum(1 for k in drafted if k)
        self.num_draft_tokens += sum(drafted)
        self.num_accepted_tokens += sum(accepted)

    def as_dict(self) -> dict:
        """Flat dict of counters and derived rates (for logging by pipelines)."""
        names = (
            "acceptance_rate", "acceptance_rate_per_position", "mean_accepted_length",
            "mean_divergence", "budget_utilization", "tokens_per_second", "expected_acceptance_per_position",
        )
        out = {k: v for k, v in self.__dict__.items()}
        out.update({name: getattr(self, name) for name in names})
        return out
