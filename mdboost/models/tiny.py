"""Tiny random-initialized Llama models and a character-level tokenizer built in code.

No network, no files: tests and the ``configs/tiny.yaml`` pipeline use these to exercise the
whole stack (pool, cache, engine, ranking) in seconds. The model is a genuine
``transformers.LlamaForCausalLM``, so everything that works with it works with SmolLM2.
"""

from __future__ import annotations

import string
import threading

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from .sources import DEFAULT_NUM_LAYERS

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0, 1, 2, 3
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

# Characters in priority order: a vocabulary of size V keeps the first V - 4 of them.
_CHARS = (
    string.ascii_lowercase + " \n" + string.digits + "()[]:=+-*/.,_'\"<>#"
    + string.ascii_uppercase + "!$%&;?@\\^`{|}~\t"
)

_INIT_LOCK = threading.Lock()  # seeded init uses the global RNG: one model at a time across threads

CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def _vocab(vocab_size: int) -> dict[str, int]:
    if int(vocab_size) != vocab_size or vocab_size < len(SPECIAL_TOKENS) + 2:
        raise ValueError(f"vocab_size must be an integer >= {len(SPECIAL_TOKENS) + 2}, got {vocab_size!r}")
    tokens = list(SPECIAL_TOKENS) + list(_CHARS[: vocab_size - len(SPECIAL_TOKENS)])
    tokens += [f"<extra_{i}>" for i in range(vocab_size - len(tokens))]
    return {tok: i for i, tok in enumerate(tokens)}


def tiny_tokenizer(vocab_size: int = 64) -> PreTrainedTokenizerFast:
    """A character-level tokenizer with ``vocab_size`` entries (4 special tokens first).

    Ids: ``<pad>`` 0, ``<s>`` 1 (bos), ``</s>`` 2 (eos), ``<unk>`` 3, then characters in the
    order lowercase, space, newline, digits, punctuation, uppercase, ... (characters beyond the
    vocabulary map to ``<unk>``). Decoding concatenates characters. Has a simple chat template.
    No BOS is added automatically (``add_special_tokens`` is a no-op), so encodings are exact.

    Parameters
    ----------
    vocab_size : int, default=64
        Number of tokens, ``>= 6``. Sizes above 4 + 95 are padded with ``<extra_i>`` tokens.
    """
    vocab = _vocab(vocab_size)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.name_or_path = f"mdboost-tiny-{vocab_size}"
    return fast


def tiny_llama(
    vocab_size: int = 64,
    num_layers: int = DEFAULT_NUM_LAYERS,
    hidden_size: int = 32,
    seed: int = 0,
    **config_overrides,
) -> LlamaForCausalLM:
    """A random-initialized ``LlamaForCausalLM`` in eval mode, deterministic from ``seed``.

    Parameters
    ----------
    vocab_size, num_layers, hidden_size : int
        Model sizes (``hidden_size`` divisible by the number of attention heads, 4 by default).
    seed : int, default=0
        Seeds a forked RNG, so the global RNG state is left untouched (a lock makes concurrent
        calls from several threads, e.g. in-process Dask workers, give the same weights).
    **config_overrides
        Any ``LlamaConfig`` field (e.g. ``initializer_range``, ``num_attention_heads``).
        ``initializer_range`` defaults to 0.2 so that next-token distributions are far from
        uniform (the transformers default 0.02 makes every logit nearly equal).
    """
    for name, value in (("vocab_size", vocab_size), ("num_layers", num_layers), ("hidden_size", hidden_size)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.2,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    fields.update(config_overrides)
    config = LlamaConfig(**fields)
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.config.name_or_path = f"tiny-llama-v{vocab_size}-l{num_layers}-h{hidden_size}-s{seed}"
    model.name_or_path = model.config.name_or_path
    return model.eval()
