"""A causal LM plus its KV cache, with per-row rollback: the only state of the engine.

Speculative and mentored decoding feed tokens that may later be rejected; the cache must then
forget them. All rows of a batch share one ``transformers.DynamicCache`` (one slot axis), so
rows that accept different numbers of tokens cannot all be cropped to their own length. The
rule used here:

- the cache is cropped (``DynamicCache.crop``) to the longest kept prefix over the rows;
- slots a row does not keep stay in the cache but are marked invalid in that row's slot mask
  (a "hole"), which becomes the ``attention_mask`` of every later forward;
- positions are never taken from the slot index: a new token's position is the number of
  valid slots before it in its row, passed explicitly as ``position_ids``.

So every row attends to exactly its own accepted tokens at their true positions, which is
what a fresh forward over the row's token sequence computes. With one row there are never
holes (the crop is exact) and no attention mask is passed at all.

:meth:`CachedLM.layer_view` lends the first ``N`` cache layers to a model whose first ``N``
decoder layers are this model's own (an early-exit drafter): it drafts on top of the
target's cache instead of a cache of its own, and gives the entries back with ``keep``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from transformers import Cache, DynamicCache

from mdboost.models.loading import cache_kwarg


class CachedLM:
    """A causal LM with a ``DynamicCache`` whose slots can be rolled back per row.

    Parameters
    ----------
    model : transformers causal LM
        Called as ``model(input_ids=, attention_mask=, position_ids=, cache=, use_cache=True)``
        (``past_key_values=`` instead of ``cache=`` on transformers versions before the rename).
    batch_size : int
        Number of rows.
    device : torch.device
        Device of the token tensors.
    """

    def __init__(self, model, batch_size: int, device: torch.device):
        self.model = model
        self.cache: Cache = DynamicCache(config=model.config)
        self._cache_key = cache_kwarg(model)
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)  # [B, S]
        self.holes = False  # any invalid slot so far (then an attention mask is required)
        self.last_fed = 0  # columns appended since the last ``keep`` (what it may drop)

    @property
    def num_slots(self) -> int:
        """Slots in the cache (valid or not)."""
        return self.valid.shape[1]

    @property
    def batch_size(self) -> int:
        return self.valid.shape[0]

    @property
    def device(self) -> torch.device:
        """Device of the token tensors."""
        return self.valid.device

    @property
    def vocab_size(self) -> int:
        """Width of the model's logits."""
        return self.model.config.get_text_config().vocab_size

    def layer_view(self, model) -> CachedLM:
        """A ``CachedLM`` over ``model`` whose cache layers ARE this cache's first ``N``.

        ``model`` has ``N`` decoder layers (its config's ``num_hidden_layers``, fewer than
        this model's) that must be this model's first ``N`` layers, with the same embeddings
        (an early-exit drafter, :func:`mdboost.models.drafters.early_exit_model`): then this
        cache's first ``N`` layers hold exactly the keys and values ``model`` would compute
        for the tokens fed so far, and the view continues from them. The view starts with a
        copy of this slot mask (holes included, so it sees each row's own tokens only).

        Feeding the view appends entries to the shared layers; give them back with
        ``view.keep([0] * batch_size)`` (which crops them off) before this ``CachedLM`` is
        fed or rolled back again. Tested: the view's logits equal a fresh forward of
        ``model`` over each row's tokens, and this cache is unchanged after the view's keep.
        """
        num_layers = model.config.get_text_config().num_hidden_layers
        if not 1 <= num_layers < len(self.cache.layers):
            raise ValueError(f"model must have between 1 and {len(self.cache.layers) - 1} decoder layers "
                             f"(fewer than this cache's), got {num_layers}")
        if self.last_fed:
            raise RuntimeError(f"call keep() before layer_view(): {self.last_fed} columns fed since the last keep")
        view = CachedLM(model, self.batch_size, self.device)
        # transformers' documented Cache(layers=...) constructor over the same layer objects
        view.cache = Cache(layers=list(self.cache.layers[:num_layers]))
        view.valid, view.holes = self.valid.clone(), self.holes
        return view

    @torch.no_grad()
    def forward(
        self,
        tokens: torch.Tensor,  # [B, L]
        valid: torch.Tensor | None = None,  # [B, L] bool, False for padding columns
        logits_to_keep: int = 0,
    ) -> torch.Tensor:  # [B, L or logits_to_keep, V]
        """Append ``tokens`` to the cache and return their logits.

        ``valid`` marks padding columns (e.g. left padding of a ragged chunk); their logits
        are meaningless and they are invisible to every other token. ``logits_to_keep > 0``
        returns only the last that many columns' logits (the LM head is skipped for the rest).
        """
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        else:
            self.holes = self.holes or not bool(valid.all())
        before = self.valid.sum(dim=1, keepdim=True)  # [B, 1] tokens already seen per row
        positions = (before + valid.cumsum(dim=1) - 1).clamp(min=0)  # [B, L]
        self.valid = torch.cat([self.valid, valid], dim=1)
        mask = self.valid.long() if self.holes else None
        out = self.model(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_key: self.cache},
            logits_to_keep=logits_to_keep,
        )
        self.last_fed += tokens.shape[1]
        return out.logits

    def keep(self, num_columns: list[int]) -> None:
        """Roll back: row ``b`` keeps its first ``num_columns[b]`` columns fed since the last keep.

        Columns beyond the longest kept prefix are cropped from the cache; the others a row
        drops become holes in that row's slot mask.
        """
        fed = self.last_fed
        if len(num_columns) != self.valid.shape[0] or not all(0 <= c <= fed for c in num_columns):
            raise ValueError(f"num_columns must be {self.valid.shape[0]} ints in [0, {fed}], got {num_columns!r}")
        longest = max(num_columns)
        drop = fed - longest
        if drop:
            self.cache.crop(-drop)
            self.valid = self.valid[:, : self.num_slots - drop]
        start = self.num_slots - longest  # first slot fed since the last keep
        for row, count in enumerate(num_columns):
            if count < longest:
                self.valid[row, start + count:] = False
                self.holes = True
        self.last_fed = 0
        if self.cache.get_seq_length() != self.num_slots:
            raise RuntimeError(
                f"cache holds {self.cache.get_seq_length()} slots but the mask {self.num_slots}"
            )


@runtime_checkable
class LMBackend(Protocol):
    """A model that runs its own forward passes (e.g. :class:`mdboost.engine.llamacpp.LlamaCppModel`):
    ``open`` returns an object with :class:`CachedLM`'s ``forward``, ``keep``, ``vocab_size``,
    ``device`` and ``batch_size``, over an empty cache."""

    vocab_size: int

    def open(self, batch_size: int, device): ...


def model_vocab_size(model) -> int:
    """The vocabulary size of a transformers causal LM (its text config's) or an :class:`LMBackend`."""
    return int(model.vocab_size if isinstance(model, LMBackend) else model.config.get_text_config().vocab_size)


def model_device(model) -> torch.device:
    """Where the engine's tensors for ``model`` live: a transformers model's parameters' device;
    the CPU for an :class:`LMBackend` (its logits come back as CPU tensors)."""
    return torch.device("cpu") if isinstance(model, LMBackend) else next(model.parameters()).device


def open_lm(model, batch_size: int, device: torch.device):
    """The engine's per-generation model state: a :class:`CachedLM` over a transformers model, or
    what an :class:`LMBackend` opens."""
    if isinstance(model, LMBackend):
        return model.open(batch_size, device)
    return CachedLM(model, batch_size, device)


def left_pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad ragged token lists into ``(tokens [B, L], valid [B, L])``."""
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        if row:
            tokens[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            valid[i, width - len(row):] = True
    return tokens.to(device), valid.to(device)
