"""What each draft's acceptance is on a given text: the chains of the draft-start process.

Given the text ``x`` (the token emitted at every position), the draft at a position ``t`` is
accepted with the *conditional* acceptance

    ``c_t = P(accepted | emitted x_t) = min(p(x_t), pi(x_t)) / pi(x_t)``

(``docs/theory.md`` section 2: ``P(accept and emit x) = min(p_x, pi_x)``, and the emitted token
is ``~ pi``), with ``pi = max{(1-b) q, min{p, (1+a) q}}`` at the MD clamp ``(a, b)`` of the
position (``docs/theory.md`` section 4) and ``pi = q`` for SD, where it reads
``min(1, p(x)/q(x))`` (:func:`conditional_acceptance`). A step started at ``s`` accepts its
``i``-th draft with ``c_{s,i}``: ``c_{s+i}`` for a model drafter (accepted drafts ARE the text,
so the drafter's context is the text's prefix; :func:`chain_from_positions`),
``1[proposal_s[i] = x_{s+i}]`` for prompt lookup (one lookup at ``s`` proposes the whole chain;
:func:`chain_from_proposals`). On ``q``-sampled text MD's chains are tilted to their mean
``P_acc`` (:func:`budget_tilt`); on a text the loop does not emit (a reference) they are the
expected acceptances (:func:`expected_chain`). A rule on greedy drafts gives its own ``c``
(``1[x_t = argmax p_t]``, :mod:`mdboost.ranking.rule_points`; ``PointInputs.conditional``).
:func:`text_chains` builds them for every operating point of a pair;
:mod:`mdboost.ranking.process` runs the start process on them.
"""

from __future__ import annotations

import torch

from mdboost.md.solve import clamp
from mdboost.ranking.layout import SequenceLayout, gather_rows, padded_index


def conditional_acceptance(draft_logp, target_logp, a=0.0, b=0.0) -> torch.Tensor:  # [N]
    """``c = min(p(x), pi(x)) / pi(x)`` of the emitted token ``x`` (see the module docstring).

    Parameters
    ----------
    draft_logp, target_logp : tensor [N]
        ``log p(x)`` and ``log q(x)`` of the emitted token (``-inf`` allowed for ``p``).
    a, b : float or tensor [N]
        The clamp point (``0, 0``: SD, ``pi = q``).

    Returns
    -------
    float64 tensor [N] in [0, 1]: ``min(1, r / max(1 - b, min(r, 1 + a)))`` with ``r = p/q``
    (0 where ``pi(x) = 0`` or ``q(x) = 0``).
    """
    lp = torch.as_tensor(draft_logp, dtype=torch.float64)
    lq = torch.as_tensor(target_logp, dtype=torch.float64)
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    if (a < 0).any() or (b < 0).any() or (b > 1).any():
        raise ValueError(f"the clamp needs a >= 0 and 0 <= b <= 1, got a={a}, b={b}")
    r = torch.exp(lp - lq)  # p(x) / q(x)
    pi_over_q = clamp(r, 1.0, a, b)  # pi(x) / q(x)
    c = torch.minimum(torch.ones_like(r), r / pi_over_q)
    ok = torch.isfinite(lq) & (pi_over_q > 0) & ~torch.isnan(c)
    return torch.where(ok, c, torch.zeros_like(c))


def chain_from_positions(accept: torch.Tensor, width: int) -> torch.Tensor:  # [B, L] -> [B, L, width]
    """``chain[b, s, i] = accept[b, s + i]`` (0 past the end): a model drafter's chain."""
    accept = torch.as_tensor(accept, dtype=torch.float64)
    n, length = accept.shape
    padded = torch.cat([accept, accept.new_zeros(n, width)], dim=1)  # [B, L + width]
    return padded.unfold(1, width, 1)[:, :length]


def chain_from_proposals(proposals: torch.Tensor, tokens: torch.Tensor, width: int):
    """A prompt-lookup drafter's chain and draft lengths.

    Parameters
    ----------
    proposals : LongTensor [B, L, J]
        Drafts offered at a start ``s`` (``-1`` padded; a row of ``-1``: no proposal), ``J >= width``.
    tokens : LongTensor [B, L]
        The text (``x_t``; padding arbitrary).
    width : int
        Chain width (the largest gamma).

    Returns
    -------
    chain : float64 [B, L, width]
        ``1[proposals[s, i] == x_{s+i}]`` (0 past the end).
    draft_len : LongTensor [B, L]
        Offered drafts per start (the valid prefix of the proposal, capped at ``width``).
    """
    if proposals.shape[-1] < width:
        raise ValueError(f"proposals must hold >= {width} drafts per start, got {proposals.shape[-1]}")
    props = proposals[..., :width].long()
    n, length = tokens.shape
    ahead = torch.cat([tokens.long(), tokens.new_full((n, width), -2).long()], dim=1).unfold(1, width, 1)[:, :length]
    chain = ((props == ahead) & (props >= 0)).double()
    draft_len = (props >= 0).long().cumprod(-1).sum(-1)
    return chain, draft_len


def tilt_delta(wanted, expected) -> torch.Tensor:  # [...] x2 -> [...]
    """``delta = (wanted - expected) / (1 - expected)`` in [0, 1]: the share of a chain's misses
    that ``c + (1 - c) delta`` turns into acceptances, moving its mean from ``expected`` up to
    ``wanted`` (0 where ``wanted <= expected``).

    >>> tilt_delta(torch.tensor([0.75, 0.2]), torch.tensor([0.5, 0.5])).tolist()
    [0.5, 0.0]
    """
    wanted = torch.as_tensor(wanted, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    return ((wanted - expected) / (1 - expected).clamp_min(1e-12)).clamp(0.0, 1.0)


def budget_tilt(p_mass: torch.Tensor, q_mass: torch.Tensor, a, b, acceptance) -> torch.Tensor:  # [M, S] -> [M]
    """``delta = (P_acc - E_q[c]) / (1 - E_q[c])`` in [0, 1]: the acceptance MD adds on ``q``-sampled text.

    The cached text is sampled from ``q``, MD emits from ``pi``: ``E_{x~q}[c(x)] = sum_i
    q_i min(1, p_i / pi_i)`` falls short of ``P_acc(pi) = E_{x~pi}[c(x)]`` (by ``b (p(B)/(1-b) -
    q(B))``; 0 for SD). The process's chain uses ``c + (1 - c) delta``, which has the right mean
    ``P_acc`` at every position and keeps the text's autocorrelation. ``p_mass``, ``q_mass``: the
    pair on a common support (:class:`~mdboost.ranking.support.Aligned` masses).
    """
    a = torch.as_tensor(a, dtype=torch.float64)[..., None]
    b = torch.as_tensor(b, dtype=torch.float64)[..., None]
    pi = clamp(p_mass, q_mass, a, b)  # [M, S]
    ratio = torch.where(pi > 0, p_mass / pi.clamp_min(1e-300), torch.zeros_like(pi)).clamp_max(1.0)
    return tilt_delta(acceptance, (q_mass * ratio).sum(-1))


def expected_chain(acceptance: torch.Tensor, width: int, same=None) -> torch.Tensor:  # [B, L] -> [B, L, W]
    """The chain of a text the loop does not emit (a reference): each draft's expected acceptance.

    On a reference text the conditional acceptance ``c_t`` read at the reference token is not
    the engine's: the emitted tokens follow ``pi``, not the reference, so ``c`` at the reference
    token is biased (a drafter that copies the reference, prompt lookup, would look accepted
    where the target rarely emits its proposal). The chain then takes ``P_acc`` of the position
    a draft is verified at (its mean under ``pi``, the same value the i.i.d. speed model uses):
    ``chain[s, i] = P_acc_{s+i}`` for a model drafter. For prompt lookup ``P_acc_{s+i}`` is the
    acceptance of the position's own proposal, so it counts only where the chain's ``i``-th
    draft is that proposal (``same``); another token's acceptance is not cached, and 0 is taken
    (a lower bound: chains that leave the reference are not credited).

    Parameters
    ----------
    acceptance : float64 [B, L]
        ``P_acc`` per position of each sequence (0 where the drafter offers nothing).
    width : int
    same : bool [B, L, W] or None
        Prompt lookup: whether draft ``i`` of a start ``s`` is the proposal at ``s + i``.

    Examples
    --------
    >>> expected_chain(torch.tensor([[0.5, 0.25, 1.0]], dtype=torch.float64), 2).tolist()
    [[[0.5, 0.25], [0.25, 1.0], [1.0, 0.0]]]
    """
    chain = chain_from_positions(acceptance, width)
    return chain if same is None else chain * same


def _tilted(chain, delta, same=None):  # [B, L, W], [B, L, W], [B, L, W] bool or None
    extra = (1 - chain) * delta
    return chain + (extra if same is None else extra * same)


def text_chains(layout: SequenceLayout, draft_rows, target_rows, labels, points, width: int, on_reference: bool = False):
    """``(chains [P, B, L, W], raw chains, offered [B, L] or None, index [B, L], lengths [B])``.

    A point with its own ``chain`` [M, >= W] (block verification: each start's expected
    continuation probabilities) keeps its text chain's ``c`` and is tilted to that chain's values
    (:func:`chain_tilt`).
    """
    chains, raw, offered, index, lengths = _text_chains(layout, draft_rows, target_rows, labels, points, width,
                                                        on_reference)
    given = [i for i, pt in enumerate(points) if pt.chain is not None]
    if given:
        chains = chains.clone()
        for i in given:
            expected = chain_from_positions(gather_rows(points[i].acceptance.double(), index), width)
            chains[i] = chain_tilt(chains[i], expected, gather_rows(points[i].chain[:, :width].double(), index))
    return chains, raw, offered, index, lengths


def chain_tilt(chain: torch.Tensor, expected: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:  # [..., W] x3
    """``chain`` (mean ``expected`` on the text) moved to mean ``wanted``, keeping its autocorrelation:
    ``c + (1 - c) (w - e) / (1 - e)`` where ``w >= e``, ``c w / e`` where ``w < e`` (the budget
    tilt's form, :func:`budget_tilt`; ``w = e`` leaves ``c`` as it is).

    >>> chain_tilt(torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5]), torch.tensor([0.75, 0.25])).tolist()
    [0.5, 0.5]
    """
    up = _tilted(chain, tilt_delta(wanted, expected))
    down = chain * wanted / expected.clamp_min(1e-300)
    out = torch.where(wanted >= expected, up, torch.where(expected > 0, down, wanted))
    return out.clamp(0.0, 1.0)


def _text_chains(layout: SequenceLayout, draft_rows, target_rows, labels, points, width: int,
                 on_reference: bool = False):
    """The chains of :func:`text_chains` from each point's ``c`` (or ``P_acc`` on a reference).

    ``raw``: the conditional acceptance ``c``; ``chains``: tilted by each point's
    :func:`budget_tilt` (a prompt-lookup chain only where the draft is the position's own proposal).
    ``on_reference``: the text is not one the loop emits, so both are the expected chain
    (:func:`expected_chain`).
    """
    index, lengths = padded_index(layout.sequence)
    tilts = [torch.zeros(index.shape, dtype=torch.float64) if pt.tilt is None else gather_rows(pt.tilt.double(), index)
             for pt in points]
    offered, same = None, None
    if draft_rows.one_hot:
        props = gather_rows(layout.proposals(width), index, -1)  # [B, L, W]
        chain, offered = chain_from_proposals(props, gather_rows(torch.as_tensor(labels).long(), index, -1), width)
        first = chain_from_positions(props[..., 0].double(), width)  # the proposal at s + i
        same = (props.double() == first) & (props >= 0)
        if not on_reference:
            tilted = [_tilted(chain, chain_from_positions(t, width), same) for t in tilts]
            return torch.stack(tilted), chain.expand(len(points), *chain.shape), offered, index, lengths
    if on_reference:
        valid = draft_rows.valid
        chains = torch.stack([expected_chain(gather_rows(torch.where(valid, pt.acceptance.double(), 0.0), index),
                                             width, same) for pt in points])
        return chains, chains, offered, index, lengths
    raw, tilted = [], []
    for pt, t in zip(points, tilts):
        c = (conditional_acceptance(draft_rows.true_logp, target_rows.true_logp, pt.a, pt.b)
             if pt.conditional is None else pt.conditional.double())
        c = chain_from_positions(gather_rows(torch.where(draft_rows.valid, c, torch.zeros_like(c)), index), width)
        raw.append(c)
        tilted.append(_tilted(c, chain_from_positions(t, width)))
    return torch.stack(tilted), torch.stack(raw), None, index, lengths
