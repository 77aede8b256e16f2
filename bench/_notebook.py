"""The public mentored decoding notebook's sampler, ported line by line (the benchmark's baseline).

Source: GitHub ``vivien000/mentored_decoding``, file ``notebook.ipynb`` (code cell 4, function
``mentored_sampling``), commit ``ace0902c48e9d6aa6c7823a71d6831c3d106ff19`` (the only commit that
touches the notebook; HEAD ``de72a1fce4e91bb45ce3c37b044073957957b4a7`` changes the README only).
Author: V. Tran-Thien. The port keeps the notebook's statements, names and order; the only
changes are (1) the body between the first acceptance test and the final draw is the function
:func:`notebook_solve`, so that the benchmark can time the solve alone and compute the
distribution the sampler emits (:func:`emitted_distribution`); (2) randomness comes from an
optional ``generator`` (the notebook calls ``torch.rand(1)`` on the global generator).

What the notebook computes (its letters: ``alpha <= 1 <= beta``; mdboost's ``1 + a = 1 / alpha``,
``1 - b = 1 / beta``; docs/theory.md, section 4). Its ``dkl`` is ``KL(q || pi)``, mdboost's
``rkl``. It sorts ``q / p`` once, keeps prefix and suffix sums and evaluates ``dkl`` in O(1) per
step of a bisection on ``alpha`` in ``[0, 1]``. Its approximations, kept by the port:

- **tolerance band**: 10 bisection steps, and any step whose ``dkl`` lies in
  ``[(1 - tol) D, (1 + tol) D]`` (``tol = 0.2``) is accepted, so its own estimate may exceed the
  budget by 20%; ``KL(q || p) <= 1.2 D`` skips the solve (``pi = p``). After 10 steps without a
  hit it keeps the last step below ``0.8 D`` (resolution ``2^-10`` on ``alpha``).
- **off-by-one in the beta index**: with ``n2`` the first sorted index where the deficit
  ``right[n2] <= one_minus_R``, the B set (``pi_i = q_i / beta``) is ``{i >= n2}``, and ``dkl``
  is computed on that set, but ``beta`` is computed from the sums over ``{i >= n2 - 1}``
  (``cumsum_last_q[n2-1] / (one_minus_R + cumsum_last_p[n2-1])``). That ``beta`` lies between
  ``q/p`` at ``n2 - 1`` and the correct value, so it is too small: ``dkl`` underestimates
  ``KL(q || pi)``, and the residual ``(q / beta - p)_+`` sums to more than the rejection mass
  (``torch.multinomial`` renormalises it), so the emitted distribution is not the clamp. A
  faithful port keeps this behaviour; :func:`emitted_distribution` gives what it really samples.
- no zero entries: the notebook adds ``1e-12`` to both distributions and renormalises before
  calling it (``draft_and_verify``), since ``log(q / p)`` and ``1 / (q / p)`` need positive
  entries; the benchmark's rows have none. Float32 throughout, as in the notebook.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class NotebookPoint(NamedTuple):
    """What the notebook's solve leaves for its final draw (``alpha is None``: ``pi = p``)."""

    alpha: float | None
    beta: object  # tensor of shape (1,) (or the float 1 of the initial best)
    one_minus_R: object  # the rejection mass sum_i (p_i - q_i / alpha)_+
    dkl: object  # the notebook's own estimate of KL(q || pi)
    sorted_q: torch.Tensor
    sorted_p: torch.Tensor
    argsort_q_over_p: torch.Tensor
    q_over_p: torch.Tensor


def notebook_solve(p, q, target_dkl, tol=0.2, fix_beta_index=False):
    """The notebook's ``mentored_sampling`` from its sort to its choice of ``alpha`` (verbatim).

    ``fix_beta_index=True`` (not the notebook) reads ``beta`` at ``n2`` instead of ``n2-1``, which
    makes its ``dkl`` the exact ``KL(q || pi)`` of the clamp: the benchmark uses it to show how
    much of the notebook's overshoot comes from the off-by-one and how much from the band.
    """
    q_over_p = q/p
    sorted_q_over_p, argsort_q_over_p = torch.sort(q_over_p)
    sorted_q = q[argsort_q_over_p]
    cumsum_q_log_q_over_p = (sorted_q*torch.log(sorted_q_over_p)).cumsum(-1)

    # If the KL divergence between q and p is less than the target KL
    # divergence, we can direct accept the draft token (we're ready to accept a
    # slightly higher KL divergence to reduce the computational overhead)
    dkl = cumsum_q_log_q_over_p[-1]
    higher_bound = target_dkl*(1+tol)
    if dkl <= higher_bound:
        return NotebookPoint(None, None, None, dkl, sorted_q, None, argsort_q_over_p, q_over_p)  # return x

    sorted_p = p[argsort_q_over_p]
    cumsum_p = sorted_p.cumsum(-1)
    cumsum_q = sorted_q.cumsum(-1)
    cumsum_last_p = torch.flip(torch.flip(sorted_p, [0]).cumsum(-1), [0])
    cumsum_last_q = torch.flip(torch.flip(sorted_q, [0]).cumsum(-1), [0])
    right = cumsum_last_q / sorted_q_over_p - cumsum_last_p

    # We're ready to accept a slightly higher KL divergence to reduce the
    # computational overhead
    lower_bound = target_dkl*(1-tol)

    min_alpha, max_alpha = 0, 1
    best_alpha, best_beta, best_one_minus_R, best_dkl = 1, 1, 1 - (torch.clip(q/p, max=1)*p).sum(), 0
    for _ in range(10):
        alpha = (min_alpha + max_alpha)/2
        try:
            n1 = torch.nonzero(sorted_q_over_p <= alpha)[-1]
        except IndexError:
            n1 = 0
        one_minus_R = cumsum_p[n1] - cumsum_q[n1] / alpha
        try:
            n2 = torch.nonzero(right <= one_minus_R)[0]
        except IndexError:
            n2 = -1
        i_beta = n2 if fix_beta_index else n2-1  # the notebook: n2-1 (module docstring)
        beta = cumsum_last_q[i_beta]/(one_minus_R + cumsum_last_p[i_beta])
        if one_minus_R < 0:
            dkl = cumsum_q_log_q_over_p[-1]
        else:
            dkl = (
                torch.math.log(alpha)*cumsum_q[n1]
                + cumsum_q_log_q_over_p[n2-1]
                - cumsum_q_log_q_over_p[n1]
                + torch.math.log(beta)*cumsum_last_q[n2]
            )

        if dkl < lower_bound:
            max_alpha = alpha
            best_alpha, best_beta, best_one_minus_R, best_dkl = alpha, beta, one_minus_R, dkl
        elif dkl > higher_bound:
            min_alpha = alpha
        else:
            break
    else:
        alpha, beta, one_minus_R, dkl = best_alpha, best_beta, best_one_minus_R, best_dkl
    return NotebookPoint(alpha, beta, one_minus_R, dkl, sorted_q, sorted_p, argsort_q_over_p, q_over_p)


def mentored_sampling(x, p, q, target_dkl, tol=0.2, generator=None):
    """
    Sample a token with mentored sampling
    """
    random_number = torch.rand(1, generator=generator)[0]
    # Whatever the target KL divergence, we know that P(x accepted) ≥ min(1, q(x)/p(x))
    if random_number*p[x] < q[x]:
        return x

    point = notebook_solve(p, q, target_dkl, tol)
    if point.alpha is None:
        return x
    alpha, beta, one_minus_R = point.alpha, point.beta, point.one_minus_R
    sorted_q, sorted_p, argsort_q_over_p = point.sorted_q, point.sorted_p, point.argsort_q_over_p

    # With α, we can now definitely accept or reject the token sampled from p
    if alpha*random_number < point.q_over_p[x]:
        return x

    # If the candidate token is rejected, we sample from s
    s = torch.clip(sorted_q/beta-sorted_p, min=0)/one_minus_R
    return argsort_q_over_p[torch.multinomial(s, 1, generator=generator)]


def emitted_distribution(p, q, point: NotebookPoint) -> torch.Tensor:
    """The distribution of the token :func:`mentored_sampling` returns, in float64 (shape of ``p``).

    Draft ``x ~ p`` is accepted with probability ``min(1, q_x / (alpha p_x))`` (its two tests use
    the same uniform, and ``alpha <= 1``); otherwise it draws from ``(q / beta - p)_+``
    renormalised. The rejection mass is ``sum_x (p_x - q_x / alpha)_+`` (its ``one_minus_R``,
    recomputed exactly), and the acceptance probability is one minus it.
    """
    p64, q64 = p.to(torch.float64), q.to(torch.float64)
    if point.alpha is None:  # KL(q || p) within 1.2 D: every draft is accepted
        return p64
    kept = torch.minimum(p64, q64 / point.alpha)
    rejected = 1 - kept.sum()
    beta = torch.as_tensor(point.beta, dtype=torch.float64).reshape(())
    s = torch.clip(q64 / beta - p64, min=0)  # in the original order (the notebook's is sorted)
    if not bool(s.sum() > 0):
        return kept / kept.sum()
    return kept + rejected.clamp(min=0) * s / s.sum()
