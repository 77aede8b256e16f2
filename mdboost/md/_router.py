"""The routes of the exact f-MD solve, every threshold that picks one, and the numpy/torch rule.

:func:`mdboost.md.solve.reference` states the exact solve (``docs/theory.md``, section 4); the
routes below compute the same point faster. This module decides; the routes run in the modules
named beside them. Every route is tested against the reference on the same cases
(``tests/test_md_routes.py``), forced by the explicit ``route=`` argument.

Routes of ``solve`` (:func:`pick`) and of ``verify``'s per-position solves (:func:`pick_rows`):

- :data:`SCALAR_ROW`: one 1-D CPU row of the primal, ``V <= ROW_VOCAB``: numpy sort and sums, the
  search in Python floats (:func:`mdboost.md._scalar_rows.solve_row`);
- :data:`BUCKETED_ROW`: one CPU row of the primal, ``V >= MIN_VOCAB``: the histogram, bracket and
  reduction of :mod:`mdboost.md._buckets`, the reduced row searched in Python floats
  (:func:`mdboost.md._buckets.solve_one`);
- :data:`BUCKETED_BATCH`: rows with ``V >= MIN_VOCAB``, primal or dual, in expected linear time
  (:func:`mdboost.md._buckets.solve_batch`);
- :data:`SORTED`: the sorted breakpoints of :class:`~mdboost.md.breakpoints.Breakpoints` and the
  batched search of :mod:`mdboost.md._search`; every other case, and ``mode="bound"``;
- :data:`REFERENCE`: the statement itself (slow; never picked, only forced).

Choices inside a route, each decided by a function here:

- the sorted route's search: up to :data:`SCALAR_ROWS` small CPU rows of the exact primal row by
  row in Python floats, more rows in arrays (:func:`scalar_search`, read in
  :func:`mdboost.md._search.primal_point`); the array search's bracket over every breakpoint up to
  :data:`SMALL_VOCAB`, the fanout search above (:func:`small_bracket`, read in
  :func:`mdboost.md._search.primal`);
- fallbacks to the sorted breakpoints inside the bucketed routes: a row whose bracketing buckets
  hold too many entries (:func:`too_full`, :data:`FALLBACK_FRACTION`) and a budget at the noise
  level (:data:`NOISE_BUDGET`), both in :mod:`mdboost.md._buckets`;
- rows the array search loses to rounding: searched again in Python floats (budgets from
  :data:`NOISE_BUDGET` on), then the bound search's point
  (:func:`rescue_rows`, :func:`mdboost.md._search.primal_point`);
- the array namespace, numpy or torch (:func:`on_numpy`; its objects:
  :func:`mdboost.md._xp.namespace_for`), and the numpy shortcuts of the sums (:func:`numpy_sums`,
  :data:`NUMPY_VOCAB`) and of the input checks (:func:`host_ok`, :data:`NUMPY_STATS_ELEMS`).

A ``namespace`` argument below is :data:`mdboost.md._xp.NUMPY` or :data:`mdboost.md._xp.TORCH`
(read by its ``name``), or None for the rule.
"""

from __future__ import annotations

import torch

SCALAR_ROW = "scalar-row"  # one small CPU row of the primal, searched in Python floats
BUCKETED_ROW = "bucketed-row"  # one large CPU row of the primal: buckets, its reduced row in Python floats
BUCKETED_BATCH = "bucketed-batch"  # large rows, primal or dual: buckets in expected linear time
SORTED = "sorted"  # the sorted breakpoints and the batched search (small / large bracket inside)
REFERENCE = "reference"  # the statement of the exact solve (mdboost.md.solve.reference)
ROUTES = (SCALAR_ROW, BUCKETED_ROW, BUCKETED_BATCH, SORTED, REFERENCE)

# A budget below this is at the rounding level of D_f's float64 evaluation (about V eps of its
# O(1) terms): there the sign of D_f - budget is noise. Such budgets take the sorted breakpoints
# (not the bucketed routes, whose reduced budget subtracts a constant of that size) and the array
# search (not the Python-float one, whose single secant path that sign can steer astray, while the
# array search's ladder evaluates many points per round and keeps the feasible side).
NOISE_BUDGET = 1e-12
MIN_VOCAB = 4096  # the bucketed routes from this vocabulary on (smaller rows: sorted)
FALLBACK_FRACTION = 0.25  # a bucketed row whose bracketing buckets hold more entries is solved sorted
FALLBACK_ENTRIES = 64  # ... and more than this many
ROW_VOCAB = 2048  # the scalar-row route up to this vocabulary (the small bracket's range)
SMALL_VOCAB = 2048  # the array search: the bracket over every breakpoint up to this vocabulary, fanout above
# Up to this many small CPU rows the exact primal searches row by row in Python floats. Measured
# (one thread, kl and hellinger, W = 257 to 2000, after a large op had cooled the caches as in
# verify): about 70 us a row there against about 0.9 ms for the array search's call plus 20 us a
# row; the two cost the same from 12 to 16 rows
SCALAR_ROWS = 12
NUMPY_VOCAB = 4096  # rows up to this vocabulary build their sorted sums in numpy on CPU (a tiny op costs less)
NUMPY_STATS_ELEMS = 1 << 14  # up to this many entries numpy's reductions cost less than torch's (measured)


def on_numpy(x: torch.Tensor, namespace=None) -> bool:
    """Whether ``x`` is computed in the numpy namespace: ``namespace``'s if given, else the rule:
    a CPU tensor that needs no gradient (``docs/theory.md`` section 9: GPU and autograd take torch
    ops; on CPU a tiny numpy op costs a fraction of a torch one).

    Examples
    --------
    >>> import torch
    >>> on_numpy(torch.zeros(2)), on_numpy(torch.zeros(2, requires_grad=True))
    (True, False)
    """
    if namespace is not None:
        return namespace.name == "numpy"
    return x.device.type == "cpu" and not x.requires_grad


def host_ok(x: torch.Tensor, namespace=None) -> bool:
    """Whether numpy reads ``x`` as it is: float32 / float64 in the numpy namespace."""
    return on_numpy(x, namespace) and x.dtype in (torch.float32, torch.float64)


def numpy_stats_ok(x: torch.Tensor, namespace=None) -> bool:
    """Whether the input check takes its statistics of ``x`` in numpy (:func:`host_ok`, small)."""
    return host_ok(x, namespace) and x.numel() <= NUMPY_STATS_ELEMS


def numpy_ok(x: torch.Tensor, namespace=None) -> bool:
    """Whether ``x`` is sorted in numpy (the numpy namespace, not empty)."""
    return on_numpy(x, namespace) and x.numel() > 0


def numpy_sums(r: torch.Tensor, namespace=None) -> bool:
    """Whether the sorted rows ``r`` [N, V] build their sums in numpy (:data:`NUMPY_VOCAB`)."""
    return numpy_ok(r, namespace) and r.shape[-1] <= NUMPY_VOCAB and r.dtype in (torch.float32, torch.float64)


def bucketed(p: torch.Tensor) -> bool:
    """Whether rows ``p`` [..., V] take a bucketed route (:data:`MIN_VOCAB`)."""
    return p.shape[-1] >= MIN_VOCAB and p.numel() > 0


def too_full(count, vocab: int):
    """Rows whose bracketing buckets hold ``count`` entries fall back to the sorted breakpoints."""
    return count > max(FALLBACK_FRACTION * vocab, FALLBACK_ENTRIES)


def row_applies(p, q) -> bool:
    """Whether the pair is one CPU row of float32 or float64, ``V <= ROW_VOCAB``, without autograd."""
    return (type(p) is torch.Tensor and type(q) is torch.Tensor and p.ndim == 1 and q.ndim == 1
            and 0 < p.shape[0] == q.shape[0] <= ROW_VOCAB and p.dtype == q.dtype
            and p.dtype in (torch.float32, torch.float64) and p.device.type == "cpu" and q.device.type == "cpu"
            and not (p.requires_grad or q.requires_grad))


def scalar_search(rows: int, vocab: int, bound: bool, xp) -> bool:
    """Whether the sorted route's exact primal, searching in the namespace ``xp``, searches its rows
    one by one in Python floats."""
    return not bound and xp.name == "numpy" and 0 < rows <= SCALAR_ROWS and vocab <= SMALL_VOCAB


def rescue_rows(vocab: int) -> bool:
    """Whether rows the array search loses to rounding are searched again in Python floats."""
    return vocab <= SMALL_VOCAB


def small_bracket(vocab: int, bracket: str | None = None) -> bool:
    """Whether the array search brackets over every breakpoint (``"small"``) or by the fanout
    search (``"large"``); ``bracket`` forces one."""
    if bracket is None:
        return vocab <= SMALL_VOCAB
    if bracket not in ("small", "large"):
        raise ValueError(f"bracket must be 'small' or 'large', got {bracket!r}")
    return bracket == "small"


def pick_rows(p: torch.Tensor, route: str | None = None) -> str:
    """The route of a batch of rows ``p`` [..., V] solved as given (``verify``'s per-position
    solves): :data:`BUCKETED_BATCH` or :data:`SORTED`; ``route`` forces one of the two."""
    if route is None:
        return BUCKETED_BATCH if bucketed(p) else SORTED
    if route not in (BUCKETED_BATCH, SORTED):
        raise ValueError(f"route must be {BUCKETED_BATCH!r} or {SORTED!r} here, got {route!r}")
    return route


def pick(p, q, budget: float | None, scalar: bool, mode: str = "exact", namespace=None) -> str:
    """The route of ``solve`` on the pair ``p``, ``q`` [..., V] as given (before any check).

    ``budget``: the Python-float budget of an exact primal on the target's support, else None;
    ``scalar``: the generator has a Python-float form (:attr:`mdboost.md.divergences.Divergence.g_float`).
    Inputs that are not tensors of rows are routed :data:`SORTED` (the checks then raise). A torch
    ``namespace`` rules out the one-row routes (their arithmetic is numpy and Python floats).

    Examples
    --------
    >>> import torch
    >>> p = torch.full((50,), 0.02, dtype=torch.float64)
    >>> pick(p, p, 0.05, True), pick(p[None], p[None], 0.05, True), pick(p, p, None, True), pick(p, p, 0.0, True)
    ('scalar-row', 'sorted', 'sorted', 'sorted')
    >>> p = torch.full((5000,), 2e-4, dtype=torch.float64)
    >>> pick(p, p, 0.05, True), pick(p[None].expand(3, -1), p, 0.05, True), pick(p, p, 0.05, True, "bound")
    ('bucketed-row', 'bucketed-batch', 'sorted')
    """
    if mode != "exact" or not torch.is_tensor(p) or not p.ndim:
        return SORTED
    one_primal = budget is not None and scalar and (namespace is None or namespace.name == "numpy")
    if one_primal and row_applies(p, q) and not 0 <= budget < NOISE_BUDGET:
        return SCALAR_ROW
    if not bucketed(p):
        return SORTED
    if one_primal and p.numel() == p.shape[-1] and p.device.type == "cpu":  # solve detaches autograd inputs
        return BUCKETED_ROW
    return BUCKETED_BATCH


def check_route(route: str, p, budget: float | None, scalar: bool, mode: str) -> str:
    """A forced ``route`` if it can solve the request on the checked rows ``p``, else a ValueError."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    if route != SORTED and mode != "exact":
        raise ValueError(f"route {route!r} solves mode='exact' only")
    if route in (SCALAR_ROW, BUCKETED_ROW) and not (budget is not None and scalar and torch.is_tensor(p) and p.numel() == p.shape[-1]
                                                    and p.device.type == "cpu"):
        raise ValueError(f"route {route!r} solves the exact primal of one CPU row with a Python-number budget "
                         f"and a generator with a Python-float form only")
    if route == SCALAR_ROW and p.dtype not in (torch.float32, torch.float64):  # its sort reads float32/64 bits
        raise ValueError(f"route {route!r} takes float32 or float64 rows, got {p.dtype}")
    return route
