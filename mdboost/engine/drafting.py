"""Drafter adapters: how the engine gets ``K`` draft tokens and their distribution ``p``.

Two kinds, one interface (``start`` / ``propose`` / ``commit``):

- :class:`ModelDrafter` wraps any causal LM of the pool (a smaller model, an early-exit or
  int8 drafter) with its own KV cache (:class:`mdboost.engine.kv.CachedLM`). It samples each
  draft token from ``p = logits_to_probs(drafter logits)`` with the same settings as the
  target, so ``p`` and ``q`` are comparable (math note, section 1).
- :class:`SharedLayersDrafter` is a :class:`ModelDrafter` for early-exit drafters whose
  layers ARE the target's: it drafts on top of the target's own KV cache (no private cache,
  no drafter prefill), chosen automatically by :func:`mdboost.engine.generate`.
- :class:`NgramAdapter` wraps the model-free prompt-lookup drafter: one-hot draft
  distributions, no cache, possibly fewer than ``K`` tokens per row (``lengths``).

The drafter cache holds every token of a row except its "pending" ones (at most two: the last
accepted draft when all ``K`` were accepted, and the token the target emitted). The next
``propose`` feeds the pending tokens in one forward, then one token per draft step.
"""

from __future__ import annotations

import torch

from mdboost.engine.kv import CachedLM, left_pad
from mdboost.md.probs import logits_to_probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:  # [B, V] -> [B]
    """One token per row from ``probs``; exact argmax for one-hot (greedy) rows."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class ModelDrafter:
    """A causal LM drafter with its own KV cache.

    Parameters
    ----------
    model : transformers causal LM
        Must share the target's vocabulary (same logits width).
    stop_below : float or None
        Confidence stop: a row stops drafting after a token whose probability under the
        drafter's raw softmax (temperature 1, no filtering) is below this value (Hugging Face's
        ``assistant_confidence_threshold`` rule); ``None`` always drafts ``k`` tokens.
    """

    kind = "model"

    def __init__(self, model, stop_below: float | None = None):
        self.model = model
        self.stop_below = stop_below
        self.vocab_size = model.config.get_text_config().vocab_size
        self._lm: CachedLM | None = None
        self._pending: list[list[int]] = []
        self._fed_pending = 0  # width of the pending chunk fed by the last propose (0: none)
        self._drafts: list[list[int]] = []

    def start(self, prompts: list[list[int]], device: torch.device) -> None:
        """Begin a generation: the whole prompt of each row is pending."""
        self._lm = CachedLM(self.model, len(prompts), device)
        self._pending = [list(p) for p in prompts]
        self._fed_pending = 0

    @torch.no_grad()
    def propose(
        self, k: int, sampling: dict, generator: torch.Generator | None, contexts: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Draft ``k`` tokens per row.

        Returns
        -------
        tokens : torch.LongTensor of shape (B, k)
        probs : torch.Tensor of shape (B, k, V)
            The drafter distribution each token was sampled from.
        lengths : list of int
            Valid drafts per row (``k`` unless ``stop_below`` stopped a row earlier; the width
            is the longest row's).
        """
        tokens, probs, self._fed_pending, lengths = _draft(self._lm, self._pending, k, sampling, generator,
                                                           self.vocab_size, self.stop_below)
        self._drafts = tokens.tolist()
        return tokens, probs, lengths

    def commit(self, num_accepted: list[int], new_tokens: list[int]) -> None:
        """Keep each row's pending tokens and accepted drafts; drop the rest."""
        if not self._fed_pending:  # nothing was fed: the new token just joins the pending ones
            for row, tok in zip(self._pending, new_tokens):
                row.append(tok)
            return
        k = len(self._drafts[0])
        fed_drafts = k - 1  # the last draft token was sampled but never fed
        keep = [self._fed_pending + min(n, fed_drafts) for n in num_accepted]
        self._lm.keep(keep)
        self._pending = [
            drafts[min(n, fed_drafts) : n] + [tok]
            for drafts, n, tok in zip(self._drafts, num_accepted, new_tokens)
        ]
        self._fed_pending = 0


def _draft(lm: CachedLM, pending, k, sampling, generator, vocab, stop_below=None):
    """Feed the pending tokens, then sample up to ``k`` drafts one by one (feeding all but the last).

    With ``stop_below``, a row's drafts end at the first token whose raw-softmax probability is
    below it (that token included); drafting ends when every row has ended.
    Returns ``(tokens [B, w], probs [B, w, V], width of the fed pending chunk or 0, lengths)``
    with ``w <= k`` the longest row's length.
    """
    batch, device = len(pending), lm.valid.device
    tokens = torch.empty(batch, k, dtype=torch.long, device=device)
    if not k:
        return tokens, torch.empty(batch, 0, vocab, device=device), 0, [0] * batch
    chunk, valid = left_pad(pending, 0, device)
    logits = lm.forward(chunk, valid, logits_to_keep=1)[:, -1]  # [B, V]
    greedy = sampling.get("temperature") == 0
    lengths = torch.full((batch,), k, dtype=torch.long, device=device)
    probs = []
    for j in range(k):
        if j:
            logits = lm.forward(tokens[:, j - 1 : j], logits_to_keep=1)[:, -1]
        probs.append(logits_to_probs(logits, **sampling))
        # greedy: the argmax on which the one-hot sits (what multinomial would return), cheaper
        tokens[:, j] = logits.argmax(-1) if greedy else sample(probs[-1], generator)
        if stop_below is not None:
            conf = torch.softmax(logits.float(), dim=-1).gather(-1, tokens[:, j : j + 1]).squeeze(-1)  # [B]
            lengths = torch.where((conf < stop_below) & (lengths == k), j + 1, lengths)
            if bool((lengths <= j + 1).all()):
                break
    width = len(probs)
    return tokens[:, :width], torch.stack(probs, dim=1), chunk.shape[1], lengths.tolist()


class SharedLayersDrafter(ModelDrafter):
    """An early-exit drafter that drafts on top of the target's own KV cache.

    Its first ``N`` decoder layers (and embeddings) ARE the target's, so the target's cache for
    those layers at accepted positions is exactly what the drafter would compute. The drafter
    therefore keeps no cache: each ``propose`` appends its draft entries to the target's first
    ``N`` cache layers (through a cache view sharing those layer objects) and crops them off
    again before the target's verification forward. This saves the drafter's prefill and its
    cache memory; the drafts are the same as with a private cache.

    Parameters
    ----------
    model : early-exit causal LM (see :func:`mdboost.models.drafters.early_exit_model`)
    target_lm : CachedLM
        The target with its cache (attached by :func:`mdboost.engine.generate`).
    """

    kind = "shared_layers"

    def __init__(self, model, target_lm: CachedLM, stop_below: float | None = None):
        super().__init__(model, stop_below)
        self.target_lm = target_lm
        self.num_layers = model.config.num_hidden_layers

    def start(self, prompts: list[list[int]], device: torch.device) -> None:
        """Nothing to set up: the state is the target's."""

    @torch.no_grad()
    def propose(self, k, sampling, generator, contexts):
        target = self.target_lm
        view = CachedLM(self.model, len(contexts), target.valid.device)
        view.cache.layers = list(target.cache.layers[: self.num_layers])
        view.valid, view.holes = target.valid.clone(), target.holes
        seen = target.valid.sum(dim=1).tolist()
        pending = [c[n:] for c, n in zip(contexts, seen)]
        tokens, probs, _, lengths = _draft(view, pending, k, sampling, generator, self.vocab_size, self.stop_below)
        if view.last_fed:
            for layer in view.cache.layers:
                layer.crop(-view.last_fed)
        return tokens, probs, lengths

    def commit(self, num_accepted: list[int], new_tokens: list[int]) -> None:
        """Nothing to roll back: the target's rollback is the drafter's."""


def shares_layers(drafter, target) -> bool:
    """True when ``drafter``'s embeddings and decoder layers are the target's own modules."""
    try:
        d, t = drafter.model, target.model
        return d.embed_tokens is t.embed_tokens and all(a is b for a, b in zip(d.layers, t.layers)) and len(d.layers) < len(t.layers)
    except AttributeError:
        return False


class NgramAdapter:
    """Prompt lookup as a drafter: one-hot ``p``, no cache, ``0..K`` tokens per row.

    Parameters
    ----------
    ngram : mdboost.models.ngram.NgramDrafter
        Anything with ``propose(input_ids [T], num_tokens) -> LongTensor [k <= num_tokens]``.
    vocab_size : int
        Width of the one-hot draft distributions (the target's logits width).
    """

    kind = "ngram"

    def __init__(self, ngram, vocab_size: int):
        self.ngram = ngram
        self.vocab_size = int(vocab_size)
        self._device = None

    def start(self, prompts: list[list[int]], device: torch.device) -> None:
        self._device = device

    def propose(
        self, k: int, sampling: dict, generator: torch.Generator | None, contexts: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Up to ``k`` prompt-lookup tokens per row, padded with token 0 (see ``lengths``)."""
        drafts = [self.ngram.propose(torch.tensor(c, dtype=torch.long), k).tolist() if k else [] for c in contexts]
        lengths = [len(d) for d in drafts]
        width = max(lengths, default=0)
        tokens = torch.zeros(len(contexts), width, dtype=torch.long)
        for i, d in enumerate(drafts):
            tokens[i, : len(d)] = torch.tensor(d, dtype=torch.long)
        tokens = tokens.to(self._device)
        probs = torch.zeros(len(contexts), width, self.vocab_size, device=self._device)
        probs.scatter_(-1, tokens.unsqueeze(-1), 1.0)
        return tokens, probs, lengths

    def commit(self, num_accepted: list[int], new_tokens: list[int]) -> None:
        """Nothing to roll back: prompt lookup reads the context afresh each time."""


def as_drafter(drafter, vocab_size: int):
    """Wrap a pool member (causal LM, n-gram drafter, or an adapter) in the drafter interface."""
    if drafter is None or hasattr(drafter, "commit"):
        return drafter
    if hasattr(drafter, "propose"):
        return NgramAdapter(drafter, vocab_size)
    if hasattr(drafter, "config") and callable(drafter):
        width = drafter.config.get_text_config().vocab_size
        if width != vocab_size:
            raise ValueError(f"drafter vocab_size ({width}) must equal the target's ({vocab_size})")
        return ModelDrafter(drafter)
    raise ValueError(f"drafter must be a causal LM, an n-gram drafter or None, got {type(drafter).__name__}")
