"""When a cost measurement has repeated enough: the median's distribution-free interval (``docs/engine.md``,
"Costs measured once, well").

A measurement runs fresh generations (repeats) and, after each, looks at the
interval of the median of every figure it reports (a drafter's ``c``; each ``v(K)`` and each MD
overhead ``s`` of the target's profile). It stops at the first repeat ``n >= min_repeats`` where
every interval is tight: half-width ``<= rel_tol * |median|`` (``s``, which can be about 0:
``<= rel_tol`` in ``T_ar`` units), or after ``max_repeats``. ``rel_tol = 0`` never stops early.
Several measurements take turns (:func:`run_in_turn`: one repeat of each per round), so that
each one's repeats are spread over the whole run rather than over a minute of it.

The interval is the classic sign-test interval ``[x_(l), x_(u)]`` of the order statistics: the
median ``m`` lies below ``x_(l)`` exactly when fewer than ``l`` samples are below ``m``, and the
count of samples below ``m`` is ``Bin(n, 1/2)`` whatever the samples' distribution (continuous,
independent repeats), so ``P(x_(l) <= m < x_(u)) = P(l <= Bin(n, 1/2) < u)``. The symmetric
choice ``l = k``, ``u = n + 1 - k`` covers with ``1 - 2 P(Bin(n, 1/2) <= k - 1)``; at 90% it
exists from ``n = 5`` on (``(1, 5)``: ``1 - 2 / 32 = 0.9375``), so no rule can stop before 5 repeats.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.90  # coverage of the median's interval the stopping rule reads
STOPPED = ("tight", "max_repeats")  # the values of a measurement's ``stopped``


def median_ranks(n: int, level: float = CONFIDENCE) -> tuple[int, int] | None:
    """1-based ranks ``(l, u)`` of the sign-test interval ``[x_(l), x_(u)]`` of the median of ``n`` samples.

    The narrowest symmetric pair (``u = n + 1 - l``) with ``P(l <= Bin(n, 1/2) < u) >= level``
    (module docstring); None when even ``(1, n)`` covers less (too few samples).

    Examples
    --------
    >>> median_ranks(4) is None, median_ranks(5), median_ranks(21)
    (True, (1, 5), (7, 15))
    """
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    tail, below, k = (1 - level) / 2, 0, 0  # below: sum of C(n, j) for j < k
    while k < n and (below + math.comb(n, k)) / 2 ** n <= tail:  # P(Bin <= k) <= tail: rank k + 1 still covers
        below += math.comb(n, k)
        k += 1
    return None if k == 0 else (k, n + 1 - k)


def median_interval(values, level: float = CONFIDENCE) -> tuple[float, float] | None:
    """The sign-test interval ``(x_(l), x_(u))`` of the median of ``values`` (:func:`median_ranks`), or None.

    Examples
    --------
    >>> median_interval([0.5, 0.1, 0.4, 0.3, 0.2])
    (0.1, 0.5)
    """
    ranks = median_ranks(len(values), level)
    if ranks is None:
        return None
    ordered = sorted(values)
    return float(ordered[ranks[0] - 1]), float(ordered[ranks[1] - 1])


def relative_half_width(values, scale: float | None = None) -> float:
    """Half-width of :func:`median_interval` over ``|median|`` (or over ``scale``); ``inf`` without an interval.

    Examples
    --------
    >>> relative_half_width([1.0, 1.5, 1.0, 0.5, 1.0])
    0.5
    >>> relative_half_width([0.0, 0.02, 0.01, 0.0, -0.02], scale=1.0)
    0.02
    """
    interval = median_interval(values)
    if interval is None:
        return math.inf
    half = (interval[1] - interval[0]) / 2
    denom = abs(statistics.median(values)) if scale is None else scale
    return half / denom if denom else (0.0 if half == 0 else math.inf)


@dataclass(frozen=True)
class StoppingRule:
    """Run at most ``max_repeats``; stop after repeat ``n >= min_repeats`` once every figure is tight.

    Attributes
    ----------
    max_repeats : int
        Repeats at most (a measurement's ``repeats``), ``>= 1``.
    min_repeats : int, default=5
        Repeats at least before the rule may stop, ``>= 1`` (below 5 the interval does not exist yet).
    rel_tol : float, default=0.02
        Largest tight half-width over ``|median|``, ``>= 0``; 0: always run ``max_repeats``.

    Examples
    --------
    >>> rule = StoppingRule(21)
    >>> rule.stops(4, 0.0), rule.stops(5, 0.02), rule.stops(5, 0.03), StoppingRule(21, rel_tol=0).stops(9, 0.0)
    (False, True, False, False)
    """

    max_repeats: int
    min_repeats: int = 5
    rel_tol: float = 0.02

    def __post_init__(self):
        for name in ("max_repeats", "min_repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        tol = self.rel_tol
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (math.isfinite(tol) and tol >= 0):
            raise ValueError(f"rel_tol must be a finite number >= 0, got {tol!r}")

    def stops(self, repeats_run: int, width: float) -> bool:
        """After ``repeats_run`` repeats whose widest relative half-width is ``width``: stop now?"""
        return self.rel_tol > 0 and repeats_run >= self.min_repeats and width <= self.rel_tol

    def repeats(self, one_repeat, width):
        """Call ``one_repeat(r)`` for ``r = 0, 1, ...`` until :meth:`stops` or ``max_repeats`` runs, as a generator.

        ``width()``: the widest relative half-width after the repeats so far. Yields ``(repeats
        run, max_repeats, width)`` after each repeat; returns (``yield from``'s value) why it
        stopped: ``"tight"`` or ``"max_repeats"``. A measurement is a generator over this one, so
        that :func:`run_in_turn` can interleave the repeats of several.

        Examples
        --------
        >>> widths = iter([0.5, 0.3, 0.1, 0.05, 0.01, 0.01])
        >>> steps = StoppingRule(21, rel_tol=0.02).repeats(lambda r: None, lambda: next(widths))
        >>> [w for _, _, w in steps]
        [0.5, 0.3, 0.1, 0.05, 0.01]
        """
        for r in range(self.max_repeats):
            one_repeat(r)
            current = width()
            yield r + 1, self.max_repeats, current
            if self.stops(r + 1, current):
                return "tight"
        return "max_repeats"

    def to_dict(self) -> dict:
        return {"max_repeats": self.max_repeats, "min_repeats": self.min_repeats, "rel_tol": self.rel_tol,
                "confidence": CONFIDENCE}

    def describe(self) -> str:
        """The rule in words, for a measurement's ``method``."""
        least = max(self.min_repeats, 5)  # the interval needs 5 repeats (module docstring)
        if self.rel_tol == 0 or self.max_repeats <= least:
            return f"a fixed count of {self.max_repeats}, no early stop"
        return (f"repeats until the {CONFIDENCE:.0%} sign-test interval of every figure's median has half-width "
                f"<= {self.rel_tol:g} x |median| (the MD overhead: x T_ar), at least {least} and at most "
                f"{self.max_repeats}")


def run_in_turn(measurements, progress=None, done=None) -> list:
    """Run several measurements' repeats in turn: each round gives every unfinished one its next repeat.

    ``measurements``: generators as :meth:`StoppingRule.repeats` makes them (each yields ``(repeats
    run, max_repeats, width)`` after a repeat and returns its result). Each stops by its own rule;
    a round runs the next repeat of every one still open, in the given order, so each
    measurement's repeats are spread over the whole run and meet the machine's changes of load
    as the others' do (``docs/engine.md``, "Costs measured once, well"). ``progress``, when given,
    is called after each repeat with ``(index, repeats run, max_repeats, width)``; ``done``, when
    given, with ``(index, result)`` as soon as measurement ``index`` has finished (to store it).

    Returns
    -------
    list
        The measurements' results, in the given order.

    Examples
    --------
    >>> def counting(name, n, log):
    ...     for r in range(n):
    ...         log.append(name)
    ...         yield r + 1, n, 0.0
    ...     return f"{name}: {n}"
    >>> log = []
    >>> run_in_turn([counting("a", 3, log), counting("b", 1, log)]), "".join(log)
    (['a: 3', 'b: 1'], 'abaa')
    """
    measurements = list(measurements)
    results: list = [None] * len(measurements)
    open_ = list(range(len(measurements)))
    while open_:
        for i in list(open_):
            try:
                state = next(measurements[i])
            except StopIteration as finished:
                results[i] = finished.value
                open_.remove(i)
                if done is not None:
                    done(i, finished.value)
                continue
            if progress is not None:
                progress(i, *state)
    return results


def run_alone(measurement, progress=None):
    """One measurement (a generator as :func:`run_in_turn` takes) run to the end; its result.

    ``progress``, when given, is called after each repeat with ``(repeats run, max_repeats, width)``.

    Examples
    --------
    >>> seen = []
    >>> run_alone(StoppingRule(3).repeats(lambda r: None, lambda: 1.0), lambda *state: seen.append(state)), seen
    ('max_repeats', [(1, 3, 1.0), (2, 3, 1.0), (3, 3, 1.0)])
    """
    return run_in_turn([measurement], None if progress is None else lambda index, *state: progress(*state))[0]
