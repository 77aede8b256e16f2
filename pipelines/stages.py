"""Where a pipeline's time goes: seconds per stage, summed over repeats (timed by
:func:`mdboost._stages.timed`), in ``summary.json`` (``seconds_by_stage``) and as one line at the
end of the run (:func:`stage_line`)."""

from __future__ import annotations


def add_seconds(stages: dict, seconds: dict) -> None:
    """Add each ``seconds[name]`` to ``stages[name]`` (a library step's own timings).

    >>> stages = {"models": 1.0}
    >>> add_seconds(stages, {"models": 2.0, "costs": 3.0}); stages
    {'models': 3.0, 'costs': 3.0}
    """
    for name, value in seconds.items():
        stages[name] = stages.get(name, 0.0) + float(value)


def stage_line(stages: dict, total: float) -> str:
    """The run's time by stage, largest first, the rest (the time between stages) last.

    >>> stage_line({"scoring": 30.0, "models": 90.4, "outputs": 2.0}, 130.0)
    'time by stage: models 90 s, scoring 30 s, outputs 2 s, other 8 s (total 130 s)'
    """
    other = max(total - sum(stages.values()), 0.0)
    parts = [f"{name} {seconds:.0f} s" for name, seconds in sorted(stages.items(), key=lambda kv: -kv[1])]
    return f"time by stage: {', '.join(parts + [f'other {other:.0f} s'])} (total {total:.0f} s)"
