"""SGLang's target-only tree verification, ported line by line to torch: a test oracle.

Source: SGLang 0.5.23 (the ``sglang`` wheel), kernel
``sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh``
(``TreeSpeculativeSamplingTargetOnly``, lines 39-175), its host wrapper
``sglang/kernels/jit/csrc/speculative/sampling.cuh`` (lines 34-111: shape and range checks,
``threshold_acc`` clamped to ``max(threshold_acc, 1e-9f)`` at line 110), the Python binding
``sglang/kernels/ops/speculative/sampling.py`` (lines 33-65) and the inverse-CDF step it calls,
FlashInfer's ``DeviceSamplingFromProb`` (``include/flashinfer/sampling.cuh``; SGLang 0.5.23
pins ``flashinfer_python==0.7.2``). The caller is ``sglang/srt/speculative/eagle_utils.py``,
``eagle_sample`` (lines 521-854): it passes ``draft_probs = zeros_like(target_probs)`` (line 748),
one coin per tree node and one final coin per request from ``_verify_coins`` (lines 457-482)
and the server's ``--speculative-accept-threshold-single`` / ``-acc`` (lines 781-782; both
default to 1.0, ``sglang/srt/arg_groups/fields/spec.py`` lines 109-116).

When SGLang runs it: a batch with a non-greedy request, on CUDA, without
``--speculative-use-rejection-sampling`` (``eagle_sample``, lines 641-647 and 713-718; an
all-greedy batch, or a CPU/XPU device, commits the target's argmax instead, and rejection
sampling refuses thresholds other than 1, ``srt/arg_groups/speculative_hook.py`` lines 1231-1240).
``target_probs`` is the target's softmax at the request's temperature, then top-k / top-p
renormalised (lines 720-744). At ``--speculative-eagle-topk 1`` the drafts are the drafter's
argmax (``fast_topk``, ``srt/utils/common.py`` lines 3941-3944; ``draft_topk1_postprocess``,
``srt/speculative/eagle_worker_v2.py`` lines 867-869; the STANDALONE worker subclasses EAGLE's,
``srt/speculative/standalone_worker_v2.py`` lines 37 and 138).

What the kernel does, per request (one CUDA block, ``bx``):

* The tree is given as flat per-request arrays over its ``N`` nodes (node 0 is the root, the
  last verified token): ``candidates`` (token of each node), ``retrive_next_token`` (first
  child, -1 for none), ``retrive_next_sibling`` (next sibling, -1 for none) and
  ``retrive_index`` (the node's slot in the flat ``predicts`` of the whole batch).
  ``target_probs[b, i]`` is the target's distribution after node ``i``.
* Depth by depth (``j = 1 .. num_speculative_tokens - 1``), the children of the last accepted
  node are tried in sibling order with ONE coin, the coin of that node
  (``uniform_samples[b, node]``; the root's for depth 1). ``prob_acc`` sums the target mass of
  the siblings tried so far; child ``x`` is accepted iff ``q_x > 0`` and
  (``coin < prob_acc / threshold_acc`` or ``q_x >= threshold_single``) (lines 77-81). With
  both thresholds 1 this is an inverse-CDF draw from ``q`` over the siblings: target-only
  sampling, lossless. The draft's probability is never read (line 92, "FIXME: leverage draft
  probs").
* A rejected child's target mass is written into ``draft_probs`` at the parent's row (line 93),
  so that the final draw, from ``relu(q - draft_probs)`` (lines 104-159), excludes every
  rejected sibling: on a chain, ``q`` with the rejected draft removed, renormalised.
* If the walk reached depth ``num_speculative_tokens - 1`` (every level accepted), the final
  draw ignores ``draft_probs`` and samples the target itself (the bonus token, lines 113-116).
  A leaf reached earlier samples ``relu(q - draft_probs)`` of the leaf, i.e. ``q`` (zeros).
* The final draw is FlashInfer's inverse CDF with ``u = coin * sum(w)``: the first index with
  ``w > 0`` whose inclusive CDF exceeds ``u``; if rounding leaves none, the last index with
  ``w > 0``; if ``w`` is all zero, ``d - 1`` (lines 164-171).
* Outputs (in place): ``predicts[retrive_index of a node]`` = the token emitted after that node
  (the accepted child, or the final draw after the last accepted node); ``accept_index[b]`` =
  the ``retrive_index`` of the root then of each accepted node; ``accept_token_num[b]`` = the
  number of accepted drafts. Other entries are left as they were ("undefined", line 174).

The port computes in the dtype of ``target_probs`` (the kernel requires float32; the ported
tests use float32). Sums run in torch's order, not CUB's block reduction: a coin within float
rounding of a CDF boundary may land on the neighbouring token on a GPU.

>>> q = torch.tensor([[[0.0, 0.25, 0.75], [1.0, 0.0, 0.0]]])  # root, then one draft (token 1)
>>> tokens, accepted = verify_chain(torch.tensor([[1]]), q, torch.tensor([[0.2, 0.5]]))
>>> tokens.tolist(), accepted.tolist()  # 0.2 < q_1 = 0.25: accepted, bonus from q after it
([[1, 0]], [1])
>>> verify_chain(torch.tensor([[1]]), q, torch.tensor([[0.3, 0.5]]))[0].tolist()  # rejected
[[2, -1]]
"""

from __future__ import annotations

import torch

__all__ = ["THRESHOLD_ACC_FLOOR", "tree_speculative_sampling_target_only", "verify_chain"]

THRESHOLD_ACC_FLOOR = 1e-9  # csrc/speculative/sampling.cuh:110, std::max(threshold_acc, 1e-9f)


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,  # [B * N] int, mutable
    accept_index: torch.Tensor,  # [B, num_speculative_tokens] int, mutable
    accept_token_num: torch.Tensor,  # [B] int, mutable
    candidates: torch.Tensor,  # [B, N] int64
    retrive_index: torch.Tensor,  # [B, N] int64
    retrive_next_token: torch.Tensor,  # [B, N] int64
    retrive_next_sibling: torch.Tensor,  # [B, N] int64
    uniform_samples: torch.Tensor,  # [B, N] float
    uniform_samples_for_final_sampling: torch.Tensor,  # [B] float
    target_probs: torch.Tensor,  # [B, N, V] float
    draft_probs: torch.Tensor,  # [B, N, V] float, mutable (rejected children's q is written in)
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """The kernel, in place, with the binding's argument names (``deterministic`` changes only
    the GPU scan's summation order, so it is accepted and ignored)."""
    batch, num_draft_tokens = candidates.shape
    num_spec = accept_index.shape[1]
    _check(candidates, retrive_index, retrive_next_token, retrive_next_sibling, uniform_samples,
           uniform_samples_for_final_sampling, target_probs, draft_probs, predicts, accept_token_num, num_spec,
           threshold_single, threshold_acc)
    dt = target_probs.dtype
    single = torch.tensor(threshold_single, dtype=torch.float32).to(dt)  # static_cast<float>
    acc = torch.tensor(max(float(threshold_acc), THRESHOLD_ACC_FLOOR), dtype=torch.float32).to(dt)
    for b in range(batch):
        parent, num_accepted, last = _walk(b, predicts, accept_index, candidates, retrive_index, retrive_next_token,
                                           retrive_next_sibling, uniform_samples, target_probs, draft_probs, num_spec,
                                           single, acc)
        accept_token_num[b] = num_accepted
        q = target_probs[b, parent]  # [V]
        p = torch.zeros_like(q) if num_accepted == num_spec - 1 else draft_probs[b, parent]  # no p for the bonus
        predicts[last] = _sample_relu(q - p, uniform_samples_for_final_sampling[b])


def _walk(b, predicts, accept_index, candidates, retrive_index, next_token, next_sibling, coins, target_probs,
          draft_probs, num_spec, single, acc):
    """Lines 64-99: the accept walk of request ``b``; returns (last accepted node, #accepted,
    its ``retrive_index``)."""
    prob_acc = torch.zeros((), dtype=target_probs.dtype)
    parent = 0  # cur_prob_offset's node
    coin = coins[b, 0]
    last = int(retrive_index[b, 0])
    accept_index[b, 0] = last
    num_accepted = 0
    cur = 0
    for _ in range(1, num_spec):
        cur = int(next_token[b, cur])
        while cur != -1:
            token = int(candidates[b, cur])
            q_x = target_probs[b, parent, token]
            prob_acc = prob_acc + q_x
            if q_x > 0 and (coin < prob_acc / acc or q_x >= single):
                prob_acc = torch.zeros_like(prob_acc)
                parent, coin = cur, coins[b, cur]
                predicts[last] = token
                num_accepted += 1
                last = int(retrive_index[b, cur])
                accept_index[b, num_accepted] = last
                break
            draft_probs[b, parent, token] = q_x  # line 93
            cur = int(next_sibling[b, cur])
        if cur == -1:
            break
    return parent, num_accepted, last


def _sample_relu(diff: torch.Tensor, coin: torch.Tensor) -> int:  # [V], () -> token id
    """Lines 104-171 with FlashInfer's ``DeviceSamplingFromProb`` (predicate ``x > 0``)."""
    w = diff.clamp(min=0)
    u = coin * w.sum()
    valid = w > 0
    hit = valid & (torch.cumsum(w, 0) > u)
    if bool(hit.any()):
        return int(hit.long().argmax())
    if bool(valid.any()):  # u at the total after rounding: the last valid index
        return int(valid.nonzero()[-1])
    return w.shape[0] - 1


def _check(candidates, retrive_index, next_token, next_sibling, coins, final_coins, target_probs, draft_probs,
           predicts, accept_token_num, num_spec, threshold_single, threshold_acc):
    """The host wrapper's checks (csrc/speculative/sampling.cuh, lines 54-77)."""
    batch, n = candidates.shape
    for name, t in (("retrive_index", retrive_index), ("retrive_next_token", next_token),
                    ("retrive_next_sibling", next_sibling), ("uniform_samples", coins)):
        if tuple(t.shape) != (batch, n):
            raise ValueError(f"{name} must have shape {(batch, n)}, got {tuple(t.shape)}")
    if tuple(final_coins.shape) != (batch,) or tuple(accept_token_num.shape) != (batch,):
        raise ValueError(f"uniform_samples_for_final_sampling and accept_token_num must have shape ({batch},)")
    if target_probs.shape[:2] != (batch, n) or draft_probs.shape != target_probs.shape:
        raise ValueError(f"target_probs and draft_probs must have shape ({batch}, {n}, V), got "
                         f"{tuple(target_probs.shape)} and {tuple(draft_probs.shape)}")
    if tuple(predicts.shape) != (batch * n,):
        raise ValueError(f"predicts must have shape ({batch * n},), got {tuple(predicts.shape)}")
    if n <= 0 or num_spec <= 0 or target_probs.shape[-1] <= 0:
        raise ValueError("draft tokens, speculative tokens and vocabulary must be non-empty")
    for name, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {value!r}")


def verify_chain(
    draft_tokens: torch.Tensor,  # [B, K]
    target_probs: torch.Tensor,  # [B, K+1, V]
    uniforms: torch.Tensor,  # [B, K+1], mdboost's order (mdboost/md/sampling.py)
    *,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
):  # -> tokens [B, K+1] (padded with -1), num_accepted [B]
    """The kernel on a chain (``--speculative-eagle-topk 1``), in mdboost's verify layout.

    The chain is laid out as EAGLE lays it out for topk = 1: node 0 the root, node ``k + 1`` the
    ``k``-th draft, ``num_speculative_tokens = K + 1`` (``EagleVerifyInput.max_tree_depth``,
    ``srt/speculative/eagle_info.py`` line 52). Uniform mapping: the draft at position ``k`` is
    tested with the coin of node ``k`` = mdboost's ``uniforms[:, k]``; the final draw uses
    ``uniform_samples_for_final_sampling`` = ``uniforms[:, K]``. The coin of node ``K`` is never
    read (node ``K`` has no child), so it is set to NaN here: a read would reject.
    """
    batch, k = draft_tokens.shape
    n = k + 1
    root = torch.zeros((batch, 1), dtype=torch.long)  # the root's token is never read
    candidates = torch.cat([root, draft_tokens.long()], dim=1)
    retrive_index = torch.arange(batch * n).view(batch, n)
    next_token = torch.where(torch.arange(n) < k, torch.arange(1, n + 1), -1).expand(batch, n).contiguous()
    next_sibling = torch.full((batch, n), -1, dtype=torch.long)
    coins = torch.cat([uniforms[:, :k], torch.full((batch, 1), float("nan"), dtype=uniforms.dtype)], dim=1)
    predicts = torch.full((batch * n,), -1, dtype=torch.long)
    accept_index = torch.full((batch, n), -1, dtype=torch.long)
    accept_token_num = torch.zeros(batch, dtype=torch.long)
    tree_speculative_sampling_target_only(
        predicts, accept_index, accept_token_num, candidates, retrive_index, next_token, next_sibling, coins,
        uniforms[:, k].contiguous(), target_probs, torch.zeros_like(target_probs),
        threshold_single=threshold_single, threshold_acc=threshold_acc)
    return predicts.view(batch, n), accept_token_num
