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
