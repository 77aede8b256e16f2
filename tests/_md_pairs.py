"""Random drafter/target pairs with the degenerate rows the MD fast-path tests need."""

import numpy as np
import torch


def dirichlet_pairs(rows, n, seed, alpha, equal_row=False):
    """float64 ``(p, q)`` of shape ``[rows, n]``: row 0 has zeros in p, row 1 zeros in q, and
    with ``equal_row`` row 2 has ``p == q``."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet([alpha] * n, size=rows)
    q = rng.dirichlet([alpha] * n, size=rows)
    p[0, : n // 3] = 0.0  # zeros in p
    q[1, n // 2:] = 0.0  # zeros in q
    if equal_row:
        p[2] = q[2]  # p == q
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    return torch.from_numpy(p), torch.from_numpy(q)


# A fuzz case (float64, pearson): q down to subnormals, ratios up to 1e287. The segment holding the
# crossing has an A mass of ~1e-40, and its closed form at the segment's far end is off by ten
# orders of magnitude, so the array search found no feasible point and returned the curve's start.
RESCUE_P = [0.0168930309937012, 7.059658083545426e-33, 9.265360495615195e-60, 4.4e-323, 3.234236099639141e-05,
            4.4e-323, 0.09954921112496959, 1.8530720991230388e-48, 9.265360495615195e-45, 9.26536049561517e-310,
            9.265360495615195e-25, 9.265360495615195e-60, 7.685127644810356e-09, 0.8835254078352052, 9.265e-320,
            9.265e-320]
RESCUE_Q = [2.2598117609441386e-45, 2.2598117609441383e-38, 2.2598117609441e-310, 2.259811760944138e-40,
            2.2598117609441383e-60, 2.259811760944138e-40, 0.31234995436701507, 2.2598117609441387e-25,
            2.259811760944139e-09, 2.2598117609441386e-30, 2.259811760944139e-09, 2.2598117609441383e-38,
            0.2613116784492232, 0.17195292755013322, 2.2598117609441e-310, 0.2543854351140049]


def bracketed_point(bp, budgets, divergence, bracket, bound=False):
    """``Breakpoints.for_divergence`` (``_bound``) by the array search with its bracket forced
    (``"small"``: every breakpoint, ``"large"``: the fanout search; ``mdboost.md._router.small_bracket``):
    the :class:`~mdboost.md.breakpoints.CurvePoint` of float64 [N] fields and ``D_f`` (or the bound) [N]."""
    from mdboost.md import _search
    from mdboost.md.breakpoints import CurvePoint, acceptance_of
    from mdboost.md.divergences import resolve

    budget = torch.as_tensor(budgets, dtype=torch.float64).reshape(-1, 1)
    a, b, m, value = _search.primal_point(bp, budget, resolve(divergence), bound, True, scalar=False, bracket=bracket)
    return CurvePoint(a.reshape(-1), b.reshape(-1), acceptance_of(m).reshape(-1)), value.reshape(-1)
