"""When a cost measurement has repeated enough: the median's distribution-free interval (``docs/engine.md``,
"Costs measured once, well").

A measurement runs fresh generations (repeats) and, after each, looks at the
interval of the median of every figure it reports (a drafter's ``c``; each ``v(K)`` and each MD
overhead ``s`` of the target's profile). It stops at the first repeat ``n >= min_repeats`` where
every figure is known well enough, or after ``max_repeats``. A figure is known well enough when
its interval's half-width is

- ``<= rel_tol * |median|`` (``s``, which can be about 0: ``<= rel_tol`` in ``T_ar`` units):
  *tight*; or
- ``<= spread_ratio`` times half the central 90% range of its single repeats: the median is
  known *within the spread*. The ranking's speedup intervals draw one whole repeat per bootstrap
  resample (:mod:`mdboost.ranking.process`), so their cost part is the single repeats' spread
  ``sigma``; the median's own error ``sigma_m`` adds to it as an independent variance, and
  ``sigma_m <= 0.458 sigma`` (:data:`SPREAD_RATIO`, ``sqrt(1.1^2 - 1)``) keeps that sum within
  10% of ``sigma``: more repeats would narrow nothing the ranking reports by more.

``rel_tol = 0`` and ``spread_ratio = 0`` never stop early. Several measurements take turns
(:func:`run_in_turn`: one repeat of each per round), so that each one's repeats are spread over
the whole run rather than over a minute of it.

The interval is the classic sign-test interval ``[x_(l), x_(u)]`` of the order statistics: the
median ``m`` lies below ``x_(l)`` exactly when fewer than ``l`` samples are below ``m``, and the
count of samples below ``m`` is ``Bin(n, 1/2)`` whatever the samples' distribution (continuous,
independent repeats), so ``P(x_(l) <= m < x_(u)) = P(l <= Bin(n, 1/2) < u)``. The symmetric
choice ``l = k``, ``u = n + 1 - k`` covers with ``1 - 2 P(Bin(n, 1/2) <= k - 1)``; at 90% it
exists from ``n = 5`` on (``(1, 5)``: ``1 - 2 / 32 = 0.9375``), so no rule can stop before 5 repeats.
Up to ``n = 7`` it is the samples' whole range, wider than their central 90%, so the spread
criterion cannot stop before 8 repeats.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.90  # coverage of the median's interval the stopping rule reads
# the median's error over the single repeats' spread that widens an interval drawing single repeats
# by at most 10%: sqrt(1 + r^2) <= 1.1 (module docstring)
SPREAD_RATIO = math.sqrt(1.1 ** 2 - 1)
STOPPED = ("tight", "spread", "max_repeats")  # the values of a measurement's ``stopped``


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


def quantile(values, q: float) -> float:
    """Linear-interpolation quantile ``q`` in ``[0, 1]`` of ``values`` (numpy's default).

    Examples
    --------
    >>> quantile([3.0, 1.0, 2.0], 0.25)
    1.5
    """
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (pos - low) * (ordered[high] - ordered[low])


def central_range(values, level: float = CONFIDENCE) -> tuple[float, float]:
    """The central ``level`` range of ``values``: their :func:`quantile` at ``(1 -/+ level) / 2``.

    Examples
    --------
    >>> central_range([0.4, 0.5, 0.6], 1.0)
    (0.4, 0.6)
    """
    if not 0 < level <= 1:
        raise ValueError(f"level must be in (0, 1], got {level!r}")
    return quantile(values, (1 - level) / 2), quantile(values, (1 + level) / 2)


def spread_half_width(values, level: float = CONFIDENCE) -> float:
    """Half the central ``level`` range of the single ``values`` (:func:`central_range`).

    Examples
    --------
    >>> spread_half_width([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    4.5
    """
    lo, hi = central_range(values, level)
    return (hi - lo) / 2


@dataclass(frozen=True)
class StoppingRule:
    """Run at most ``max_repeats``; stop after repeat ``n >= min_repeats`` once every figure is known well enough.

    A figure is given as ``(values, scale)``: its samples so far, and ``None`` to judge its
    half-width relative to ``|median|`` or a number to judge it in those units (module docstring).

    Attributes
    ----------
    max_repeats : int
        Repeats at most (a measurement's ``repeats``), ``>= 1``.
    min_repeats : int, default=5
        Repeats at least before the rule may stop, ``>= 1`` (below 5 the interval does not exist yet).
    rel_tol : float, default=0.02
        Largest tight half-width over ``|median|`` (or over ``scale``), ``>= 0``; 0: no figure is tight.
    spread_ratio : float, default=SPREAD_RATIO
        Largest half-width over half the central 90% range of the single repeats at which the
        median counts as known within the spread, ``>= 0``; 0: never (``rel_tol`` alone decides).

    Examples
    --------
    >>> rule = StoppingRule(21, spread_ratio=0)
    >>> exact, close = [1.0] * 5, [1.0, 1.0, 1.01, 0.99, 1.0]
    >>> rule.stops(4, [(exact, None)]), rule.stops(5, [(exact, None)]), rule.stops(5, [(close, None)])
    (None, 'tight', 'tight')
    >>> StoppingRule(21, rel_tol=0, spread_ratio=0).stops(9, [([1.0] * 9, None)]) is None
    True
    """

    max_repeats: int
    min_repeats: int = 5
    rel_tol: float = 0.02
    spread_ratio: float = SPREAD_RATIO

    def __post_init__(self):
        for name in ("max_repeats", "min_repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("rel_tol", "spread_ratio"):
            tol = getattr(self, name)
            if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (math.isfinite(tol) and tol >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {tol!r}")

    def _known(self, values, scale) -> str | None:
        """``"tight"``, ``"spread"`` or None for one figure's samples."""
        interval = median_interval(values)
        if interval is None:
            return None
        if self.rel_tol > 0 and relative_half_width(values, scale) <= self.rel_tol:
            return "tight"
        if self.spread_ratio > 0 and (interval[1] - interval[0]) / 2 <= self.spread_ratio * spread_half_width(values):
            return "spread"
        return None

    def stops(self, repeats_run: int, figures) -> str | None:
        """After ``repeats_run`` repeats of the ``figures`` (``(values, scale)`` pairs): why stop now, or None.

        ``"tight"`` when every figure is tight, ``"spread"`` when every figure is tight or known
        within its spread (and some only so), None otherwise or below ``min_repeats``.
        """
        if repeats_run < self.min_repeats:
            return None
        reasons = [self._known(values, scale) for values, scale in figures]
        if None in reasons:
            return None
        return "spread" if "spread" in reasons else "tight"

    def repeats(self, one_repeat, figures):
        """Call ``one_repeat(r)`` for ``r = 0, 1, ...`` until :meth:`stops` or ``max_repeats`` runs, as a generator.

        ``figures()``: the ``(values, scale)`` of every figure after the repeats so far. Yields
        ``(repeats run, max_repeats, width)`` after each repeat, ``width`` the widest relative
        half-width (:func:`relative_half_width`; ``inf`` below 5 repeats); returns (``yield
        from``'s value) why it stopped: ``"tight"``, ``"spread"`` or ``"max_repeats"``. A
        measurement is a generator over this one, so that :func:`run_in_turn` can interleave the
        repeats of several.

        Examples
        --------
        >>> samples = []
        >>> steps = StoppingRule(21).repeats(lambda r: samples.append(1.0 + 0.01 * (r % 3)), lambda: [(samples, None)])
        >>> [round(w, 3) for _, _, w in steps]
        [inf, inf, inf, inf, 0.01]
        """
        for r in range(self.max_repeats):
            one_repeat(r)
            current = figures()
            yield r + 1, self.max_repeats, max(relative_half_width(values, scale) for values, scale in current)
            reason = self.stops(r + 1, current)
            if reason is not None:
                return reason
        return "max_repeats"

    def to_dict(self) -> dict:
        return {"max_repeats": self.max_repeats, "min_repeats": self.min_repeats, "rel_tol": self.rel_tol,
                "spread_ratio": self.spread_ratio, "confidence": CONFIDENCE}

    def describe(self) -> str:
        """The rule in words, for a measurement's ``method``."""
        least = max(self.min_repeats, 5)  # the interval needs 5 repeats (module docstring)
        if (self.rel_tol == 0 and self.spread_ratio == 0) or self.max_repeats <= least:
            return f"a fixed count of {self.max_repeats}, no early stop"
        tests = []
        if self.rel_tol > 0:
            tests.append(f"<= {self.rel_tol:g} x |median| (the MD overhead: x T_ar)")
        if self.spread_ratio > 0:
            tests.append(f"<= {self.spread_ratio:.3g} x half the single repeats' central 90% range")
        return (f"repeats until the {CONFIDENCE:.0%} sign-test interval of every figure's median has half-width "
                f"{' or '.join(tests)}, at least {least} and at most {self.max_repeats}")


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
    >>> run_alone(StoppingRule(3).repeats(lambda r: None, lambda: [([1.0], None)]), lambda *state: seen.append(state)), seen
    ('max_repeats', [(1, 3, inf), (2, 3, inf), (3, 3, inf)])
    """
    return run_in_turn([measurement], None if progress is None else lambda index, *state: progress(*state))[0]
