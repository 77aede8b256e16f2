"""Textbook speculative decoding, row by row: the reference that ``verify`` at budget 0 must equal."""

import numpy as np
import torch

from mdboost.md.verify import PLACEHOLDER_TOKEN_ID


def reference_sd(tokens, p, q, u):
    """Textbook SD, row by row: u_k < min(1, q/p); residual (q - p)_+; inverse CDF with u_K.

    ``tokens`` [B, K], ``p`` [B, K, V], ``q`` [B, K + 1, V] and the uniforms ``u`` [B, K + 1] as
    numpy arrays (``verify``'s order: the K acceptance tests, then the one categorical draw).
    """
    batch, k, _ = p.shape
    out = np.full((batch, k + 1), PLACEHOLDER_TOKEN_ID)
    for i in range(batch):
        n = 0
        while n < k and u[i, n] < min(1.0, q[i, n, tokens[i, n]] / p[i, n, tokens[i, n]]):
            out[i, n] = tokens[i, n]
            n += 1
        w = q[i, k] if n == k else np.maximum(q[i, n] - p[i, n], 0)
        cdf = torch.cumsum(torch.tensor(w), 0)
        out[i, n] = int(torch.searchsorted(cdf, u[i, k] * cdf[-1], right=True))
    return out
