"""Drafters derived from the target: early exits, tuned-lens exits and int8 quantization.

- ``early_exit:N``: the first ``N`` decoder layers, the final norm and the LM head of the target
  (self-speculative drafting). The draft model *shares* the target's modules: no weight copy.
- ``tuned:N``: the same exit with an affine translator ``h_N -> h_L`` (layer-``N`` hidden state
  to the final layer's pre-norm hidden state) inserted before the final norm: the "tuned lens"
  of Belrose et al. 2023, here fitted in closed form by (ridge-stabilised) least squares on
  hidden states of bundled text. Fitted once, stored next to the converted model.
- ``int8``: int8 quantization of a copy of the target's ``nn.Linear`` layers, activations
  quantized per token (CPU).

Every drafter is a genuine ``transformers`` causal LM: it works with ``DynamicCache`` and with
``model.generate(..., assistant_model=...)``.

Hidden-state convention: ``output_hidden_states`` gives ``hidden_states[0]`` = embeddings and
``hidden_states[N]`` = after ``N`` layers for ``N < L``, but ``hidden_states[L]`` is the
*normed* output in transformers 5; so the fit captures the final norm's input with a hook.
"""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.quantization import quantize_dynamic

from mdboost._io import atomic_path


def _check_depth(target, num_layers: int) -> int:
    total = target.config.num_hidden_layers
    if int(num_layers) != num_layers or not 1 <= num_layers < total:
        raise ValueError(f"num_layers must be an integer in [1, {total - 1}] for this target, got {num_layers!r}")
    return int(num_layers)


def early_exit_model(target, num_layers: int, translator: nn.Module | None = None):
    """A causal LM made of the target's first ``num_layers`` layers, final norm and LM head.

    Parameters are shared with ``target`` (same ``nn.Parameter`` objects). With
    ``translator`` (``hidden -> hidden``), the final norm becomes ``Sequential(translator, norm)``.
    """
    num_layers = _check_depth(target, num_layers)
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types)[:num_layers]
    with torch.device("meta"):
        draft = type(target)(config)
    for name, child in target.model.named_children():
        if name == "layers":
            child = nn.ModuleList(child[:num_layers])
        elif name == "norm" and translator is not None:
            child = nn.Sequential(translator, child)
        setattr(draft.model, name, child)
    draft.lm_head = target.lm_head
    for name, tensor in list(draft.named_parameters()) + list(draft.named_buffers()):
        if tensor.is_meta:
            raise RuntimeError(f"early exit left {name} unassigned; unsupported architecture {type(target).__name__}")
    draft.generation_config = copy.deepcopy(target.generation_config)
    draft.name_or_path = f"{getattr(target, 'name_or_path', '')}#exit{num_layers}"
    return draft.eval()


@torch.no_grad()
def hidden_pairs(target, sequences, depths, max_positions: int = 4096):
    """Collect ``{N: (h_N [P, H], h_final_prenorm [P, H])}`` over token sequences.

    ``sequences``: iterable of 1-D LongTensors. Stops after ``max_positions`` positions.
    """
    captured = {}
    hooks = [target.model.norm.register_forward_pre_hook(lambda m, args: captured.__setitem__("final", args[0]))]
    for n in depths:
        layer = target.model.layers[n - 1]
        hooks.append(layer.register_forward_hook(
            lambda m, args, out, n=n: captured.__setitem__(n, out[0] if isinstance(out, tuple) else out)))
    xs, ys, count = {n: [] for n in depths}, [], 0
    device = target.device
    try:
        for ids in sequences:
            if count >= max_positions:
                break
            ids = ids[: max_positions - count].to(device)
            target.model(input_ids=ids[None], use_cache=False)
            ys.append(captured["final"][0].float())
            for n in depths:
                xs[n].append(captured[n][0].float())
            count += ids.numel()
    finally:
        for hook in hooks:
            hook.remove()
    if count == 0:
        raise ValueError("sequences must hold at least one token")
    final = torch.cat(ys)
    return {n: (torch.cat(xs[n]), final) for n in depths}


def fit_translator(hidden_in: torch.Tensor, hidden_out: torch.Tensor, ridge: float = 1e-4) -> nn.Linear:  # [P, H], [P, H]
    """Least-squares affine map ``hidden_in -> hidden_out`` as an ``nn.Linear(H, H)``.

    Solved in float64 from the normal equations with a ridge ``ridge * mean diag`` on the
    weights (not the bias), which keeps the solve well posed when ``P`` is close to ``H``.
    """
    if hidden_in.shape != hidden_out.shape or hidden_in.ndim != 2:
        raise ValueError(f"hidden_in and hidden_out must both be [P, H], got {tuple(hidden_in.shape)} and {tuple(hidden_out.shape)}")
    x = hidden_in.double()
    x = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)  # [P, H + 1]
    gram = x.T @ x
    reg = torch.full((gram.shape[0],), ridge * gram.diagonal()[:-1].mean().item(), dtype=gram.dtype)
    reg[-1] = 0.0
    solution = torch.linalg.solve(gram + torch.diag(reg), x.T @ hidden_out.double())  # [H + 1, H]
    size = hidden_in.shape[1]
    linear = nn.Linear(size, size, bias=True)
    with torch.no_grad():
        linear.weight.copy_(solution[:-1].T)
        linear.bias.copy_(solution[-1])
    return linear


def tuned_translators(target, depths, sequences_fn, store: str | os.PathLike | None = None, max_positions: int = 4096):
    """Fitted translators ``{N: nn.Linear}``, loaded from ``store`` when already fitted.

    ``sequences_fn()`` returns the token sequences to fit on (called only if a fit is needed).
    Each translator lives in ``store/tuned_lens_layer{N}.safetensors`` (atomic write).
    """
    result, missing = {}, []
    for n in depths:
        _check_depth(target, n)
        path = None if store is None else Path(store) / f"tuned_lens_layer{n}.safetensors"
        if path is not None and path.is_file():
            state = load_file(str(path))
            size = state["weight"].shape[0]
            linear = nn.Linear(size, size)
            linear.load_state_dict(state)
            result[n] = linear
        else:
            missing.append(n)
    if missing:
        for n, (x, y) in hidden_pairs(target, sequences_fn(), missing, max_positions).items():
            result[n] = fit_translator(x, y)
            if store is not None:
                path = Path(store) / f"tuned_lens_layer{n}.safetensors"
                state = {k: v.detach().float().contiguous() for k, v in result[n].state_dict().items()}
                with atomic_path(path) as tmp:
                    save_file(state, str(tmp), metadata={"positions": str(x.shape[0]), "layer": str(n)})
    param = next(target.parameters())
    return {n: result[n].to(device=param.device, dtype=param.dtype).eval() for n in depths}


def _shared_parameters(target) -> dict:
    """``deepcopy`` memo that makes the copy hold the target's own parameters (float32 only).

    Quantization builds new packed weights from the ``nn.Linear`` ones and leaves the float
    parameters untouched, so only what stays unquantized (embedding table, norms) remains
    shared after it, and no transient float copy of the Linear weights is made. Empty for a
    non-float32 target, whose copy ``.float()`` casts (in place, were it shared).
    """
    params = list(target.parameters())
    if any(p.dtype != torch.float32 for p in params):
        return {}
    return {id(p): p for p in params}


class TokenScaledInt8Linear(nn.Module):
    """An int8 ``Linear`` whose activations are quantized with one scale per token (row).

    ``torch.ao``'s dynamic ``Linear`` quantizes its whole input with one scale taken over every
    row, so a row's output depends on the other rows of the call: on the other tokens of a
    prefill, and on the other sequences of a batch. Here each row ``x`` is divided by its own
    ``m = max |x|`` and two constant features ``+1, -1`` (weight columns of zeros) are appended:
    every row of the tensor then spans exactly ``[-1, 1]``, so the tensor's scale is fixed and
    each row is quantized as if alone, on the same FBGEMM int8 kernel. The output is scaled back
    by ``m`` and the bias added in float (an all-zero row gives the bias). This is per-token dynamic int8 activation
    quantization (as vLLM's W8A8-INT8 does), with the weights quantized as ``quantize_dynamic``
    does (qint8, one scale per tensor).
    """

    def __init__(self, dynamic: DynamicLinear):
        super().__init__()
        weight, bias = dynamic._weight_bias()  # qint8 [N, K], float [N] or None
        padded = torch.cat([weight.dequantize(), weight.new_zeros(weight.shape[0], 2, dtype=torch.float32)], 1)
        qweight = torch.quantize_per_tensor(padded, weight.q_scale(), weight.q_zero_point(), torch.qint8)
        self._packed = torch.ops.quantized.linear_prepack(qweight, None)  # [N, K + 2]: exact (same grid)
        self.register_buffer("bias", None if bias is None else bias.detach().float(), persistent=False)
        self.register_buffer("_anchors", torch.tensor([1.0, -1.0]), persistent=False)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        m = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
        z = torch.cat([x / m, self._anchors.expand(*x.shape[:-1], 2)], -1)  # [..., K + 2]: rows span [-1, 1]
        y = torch.ops.quantized.linear_dynamic(z, self._packed, reduce_range=True) * m  # [..., N]
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, per-token activation scales"


def mixes_positions(model) -> bool:
    """True when ``model``'s output at one position depends on the other tokens of its forward.

    ``torch.ao``'s dynamic ``Linear`` layers quantize their input with one activation scale per
    call, taken over every token of the forward: the logits of a position then differ between a
    whole-sequence forward and the engine's one-token draft steps. Such models must be cached
    the way the engine runs them (:func:`mdboost.cache.build.member_logits`). :func:`int8_model`
    uses :class:`TokenScaledInt8Linear` instead, whose tokens are quantized independently.
    """
    return any(isinstance(m, DynamicLinear) for m in model.modules())


def int8_model(target):
    """An int8-quantized copy of ``target`` (``nn.Linear`` layers only), on CPU.

    Weights: ``torch.ao.quantization.quantize_dynamic`` (qint8, one scale per tensor;
    deprecated in torch 2.13 in favour of torchao, but still working; its deprecation warnings
    are silenced here). Activations: one scale per token (:class:`TokenScaledInt8Linear`), so a
    token's logits do not depend on the other tokens of its forward or on the other rows of a
    batch: the drafter drafts the same alone and batched. Only ``nn.Linear`` modules are
    quantized; the rest (embedding table, norms) is what the drafter shares with the target.
    For a float32 target those parameters are the target's own (no copy: for SmolLM2-135M that
    is the 49152 x 576 embedding table, 113 MB); a target in another dtype is copied and cast to
    float32. A tied LM head is quantized as a copy, leaving the embedding table as is.
    """
    if next(target.parameters()).device.type != "cpu":
        raise ValueError("int8 drafters need a CPU target (dynamic quantization kernels are CPU-only)")
    model = copy.deepcopy(target, memo=_shared_parameters(target)).float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, DynamicLinear):
                    setattr(parent, name, TokenScaledInt8Linear(child))
    model.name_or_path = f"{getattr(target, 'name_or_path', '')}#int8"
    return model.eval()
