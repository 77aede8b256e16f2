"""One self-normalized boosting round and the margin bound (paper Section 4).

Definitions in ``docs/boosting.md`` ("The algorithm"). Given label scores
``g_i = y_i^T h_t(x_i)`` and weights ``w_t`` in the simplex:

- normalizer ``h*_t = max_i |g_i|`` over the support of the weights (``w_1i > 0``);
- ``u_ti = g_i / h*_t`` in [-1, 1] on the support; edge ``mu_t = sum_i w_ti u_ti``;
- leveraging coefficient ``alpha_t = ln((1 + mu_t) / (1 - mu_t)) / (2 h*_t)``;
- self-normalized update ``w_(t+1),i = w_ti (1 - mu_t u_ti) / (1 - mu_t^2)``, which sums to 1
  with no normalizing constant and stays >= 0.

Margin bound (Bartlett et al. 1998 form, eps_t = (1 - mu_t) / 2): the weighted fraction of
normalized margins ``y_i^T H_T(x_i) / sum_t |alpha_t| h*_t <= theta`` is at most
``prod_t sqrt((1 - |mu_t|)^(1 - theta) (1 + |mu_t|)^(1 + theta))``. Proof sketch for the
self-normalized weights: ``(1 - mu u) / (1 - mu^2) >= exp(-alpha h* u) / sqrt(1 - mu^2)`` on
``u in [-1, 1]`` (a chord above a convex function, equal at u = +-1), so ``w_(T+1),i`` dominates
``w_1i exp(-y_i^T H_T(x_i)) / prod_t sqrt(1 - mu_t^2)``; the weights sum to 1 and
``exp(-y^T H) >= exp(-theta sum_t |alpha_t| h*_t)`` when the margin is <= theta.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EDGE_EPS", "Step", "edge_step", "margin_bound", "margin_risk", "score_tolerance"]

EDGE_EPS = 1e-10
"""A perfect hypothesis (``|mu| = 1``) has its edge capped at ``1 - EDGE_EPS`` so that
``alpha = ln((2 - EDGE_EPS) / EDGE_EPS) / (2 h*)`` (about ``11.9 / h*``) stays finite."""


@dataclass(frozen=True)
class Step:
    """Outcome of one boosting round.

    Attributes
    ----------
    weights : ndarray of shape (m,) or None
        ``w_(t+1)``; None when the hypothesis is rejected (useless).
    edge : float
        ``mu_t`` (capped at ``+-(1 - EDGE_EPS)``).
    alpha : float
        Leveraging coefficient ``alpha_t``.
    normalizer : float
        ``h*_t``.
    stop_reason : str or None
        Why boosting stops after this round (None: go on).
    """

    weights: np.ndarray | None
    edge: float
    alpha: float
    normalizer: float
    stop_reason: str | None = None


def score_tolerance(scale: float) -> float:
    """``64 eps max(1, M)``: the rounding level of label scores of magnitude up to ``M`` (``scale``),
    below which an edge is noise (estimator and pool mode alike).

    >>> bool(score_tolerance(0.5) == 64 * np.finfo(np.float64).eps)
    True
    """
    return 64 * np.finfo(np.float64).eps * max(1.0, float(scale))


def edge_step(g, w, tol=0.0) -> Step:
    """Run the round's arithmetic for label scores ``g`` under weights ``w``.

    Parameters
    ----------
    g : ndarray of shape (m,)
        Label scores ``y_i^T h_t(x_i)``.
    w : ndarray of shape (m,)
        Current weights ``w_t`` (in the simplex).
    tol : float, default=0.0
        ``h*_t <= tol`` counts as a useless hypothesis (rounding noise of ``y^T h`` for a
        hypothesis that is constant over the classes).

    Returns
    -------
    Step

    Examples
    --------
    >>> step = edge_step(np.array([1.0, -1.0]), np.array([0.75, 0.25]))
    >>> round(step.edge, 6), step.weights.tolist()
    (0.5, [0.5, 0.5])
    """
    support = w > 0
    h_star = float(np.max(np.abs(g[support]))) if support.any() else 0.0
    if not np.isfinite(h_star):
        raise ValueError(f"hypothesis label scores must be finite, got h* = {h_star}")
    if h_star <= tol:
        return Step(None, 0.0, 0.0, h_star, f"useless hypothesis (h* = {h_star:.3g} <= {tol:.3g})")
    u = g / h_star
    mu = float(w @ u)
    reason = None
    if abs(mu) >= 1.0 - EDGE_EPS:
        mu = float(np.sign(mu)) * (1.0 - EDGE_EPS)
        reason = "perfect hypothesis (|edge| = 1, capped at 1 - EDGE_EPS)"
    alpha = (np.log1p(mu) - np.log1p(-mu)) / (2.0 * h_star)
    weights = np.where(support, w * (1.0 - mu * u) / (1.0 - mu * mu), 0.0)
    return Step(weights, mu, float(alpha), h_star, reason)


def _theta(theta) -> np.ndarray:
    """``theta`` as float64, a real number or an array of them in [-1, 1] (numpy would read a
    str such as ``"0.1"`` as its number: a TypeError here)."""
    theta_arr = np.asarray(theta)
    if theta_arr.dtype.kind not in "iuf":  # str, bytes, bool, complex, object
        raise TypeError(f"theta must be a real number or an array of them, got {theta!r}")
    theta_arr = theta_arr.astype(np.float64)
    if np.any(~np.isfinite(theta_arr)) or np.any(np.abs(theta_arr) > 1):
        raise ValueError(f"theta must lie in [-1, 1], got {theta!r}")
    return theta_arr


def scaled_weights(w: np.ndarray) -> np.ndarray:
    """Non-negative sample weights ``w`` divided by their maximum: the same ratios, and a sum
    that cannot overflow (1e307 each would sum to inf and normalise to 0); ValueError unless
    the sum is positive."""
    if w.size and w.max() > 0:
        w = w / w.max()
    if not w.sum() > 0:
        raise ValueError(f"sample_weight must have a positive sum, got {w.sum()}")
    return w


def margin_bound(edges, theta):
    """``prod_t sqrt((1 - |mu_t|)^(1 - theta) (1 + |mu_t|)^(1 + theta))``.

    Parameters
    ----------
    edges : array-like of shape (T,)
        Edges ``mu_t`` in (-1, 1).
    theta : float or array-like
        Margin thresholds in [-1, 1].

    Returns
    -------
    float or ndarray (shape of ``theta``)

    Examples
    --------
    >>> round(margin_bound([0.5], 0.0), 12) == round(float(np.sqrt(0.75)), 12)
    True
    """
    theta_arr = _theta(theta)
    mu = np.abs(np.asarray(edges, dtype=np.float64))
    lo, hi = np.log1p(-mu).sum(), np.log1p(mu).sum()
    out = np.exp(0.5 * ((1.0 - theta_arr) * lo + (1.0 + theta_arr) * hi))
    return out if out.ndim else float(out)


def margin_risk(normalized_margins, theta, sample_weight=None):
    """Weighted fraction of normalized margins ``<= theta``.

    Parameters
    ----------
    normalized_margins : array-like of shape (m,)
    theta : float or array-like
    sample_weight : array-like of shape (m,), optional
        Default: uniform.

    Returns
    -------
    float or ndarray (shape of ``theta``)

    Examples
    --------
    >>> margin_risk([-0.5, 0.1, 0.9], 0.1)
    0.6666666666666666
    """
    rho = np.asarray(normalized_margins, dtype=np.float64)
    w = np.ones_like(rho) if sample_weight is None else np.asarray(sample_weight, np.float64)
    theta_arr = _theta(theta)  # as margin_bound
    if w.shape != rho.shape:
        raise ValueError(f"sample_weight must have shape {rho.shape}, got {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any():  # a risk is a weighted fraction: in [0, 1]
        raise ValueError(f"sample_weight must be finite and >= 0, got min {w.min()}, max {w.max()}")
    w = scaled_weights(w)
    below = rho[None, :] <= theta_arr.reshape(-1, 1)
    out = (below @ w) / w.sum()
    return out.reshape(theta_arr.shape) if theta_arr.ndim else float(out[0])
