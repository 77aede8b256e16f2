"""Mentored decoding inside Hugging Face ``generate``: ``custom_generate=mentored_generate``.

transformers (>= 4.56) runs a Python callable given as ``model.generate(..., custom_generate=fn)``
in place of its own decoding loop: it prepares the generation config, the logits processors
and the stopping criteria as usual, then calls ``fn(model, input_ids, logits_processor=...,
stopping_criteria=..., generation_config=..., **kwargs)``, forwarding only the keyword
arguments that ``fn`` names and ``GenerationMixin._sample`` does not (so ``assistant_model=``
never reaches it; the drafter has its own name here)::

    out = target.generate(**inputs, custom_generate=mdboost.hf.mentored_generate,
                          drafter="tuned:12", max_divergence=0.05, divergence="kl",
                          num_draft_tokens=4, do_sample=True, temperature=0.7, max_new_tokens=64)

:func:`mentored_generate` translates that call into one :func:`mdboost.engine.generate` call
(the same loop, drafters and :func:`mdboost.md.verify.verify`; nothing is re-implemented):

- sampling: a trailing ``Temperature`` / ``TopK`` / ``TopP`` warper (what ``temperature``,
  ``top_k``, ``top_p`` build) becomes the engine's own sampling settings (the same
  definitions as :func:`mdboost.logits_to_probs`); every other processor runs as the engine's
  ``logits_processor`` on the drafter's and the target's logits alike, before the clamp;
  ``do_sample=False`` is greedy (temperature 0);
- stopping: ``max_length`` / ``max_new_tokens`` and a single EOS id are the engine's own;
  other criteria (several EOS ids, ``stop_strings``, ``max_time``, custom ones) run as its
  ``stopping_criteria`` after each emitted token;
- output: the sequences as transformers returns them, or with ``return_dict_in_generate`` a
  :class:`MentoredGenerateOutput` carrying the engine's :class:`~mdboost.engine.GenerationStats`.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, StoppingCriteriaList
from transformers.generation import logits_process as lp
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin

from mdboost.data import fit_sequences
from mdboost.engine import Drafter, GenerationSettings, GenerationStats, ModelDrafter, NgramAdapter, as_drafter
from mdboost.engine import generate as engine_generate
from mdboost.engine.settings import DEFAULT_MD_SOLVE
from mdboost.models.convert import is_converted
from mdboost.models.drafters import early_exit_model, int8_model, tuned_translators
from mdboost.models.loading import load_model
from mdboost.models.ngram import NgramDrafter
from mdboost.models.pool import parse_drafter, tuned_store
from mdboost.models.tiny import tiny_tokenizer

# processors whose output depends on a row's length or padding: exact for one row only (the
# engine's rows advance at different speeds, so a batch is left-padded to its longest row)
_LENGTH_PROCESSORS = (lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor,
                      lp.ExponentialDecayLengthPenalty, lp.ForcedEOSTokenLogitsProcessor,
                      lp.SuppressTokensAtBeginLogitsProcessor)
# processors that read the whole row: the hooks' extra left padding of rows that fell behind (their
# pad id) is what they would count, where transformers' rows, in lockstep, have none
_WHOLE_ROW_PROCESSORS = (lp.RepetitionPenaltyLogitsProcessor, lp.NoRepeatNGramLogitsProcessor,
                         lp.EncoderNoRepeatNGramLogitsProcessor)
_ONE_ROW_PROCESSORS = _LENGTH_PROCESSORS + _WHOLE_ROW_PROCESSORS  # exact for one row only
# processors that keep state from call to call, assuming one call per generated token; the engine
# calls them at every scored position, on the drafter's logits and the target's
_STATEFUL_PROCESSORS = tuple(getattr(lp, name) for name in (
    "UnbatchedClassifierFreeGuidanceLogitsProcessor", "SynthIDTextWatermarkLogitsProcessor",
    "WhisperTimeStampLogitsProcessor", "BarkEosPrioritizerLogitsProcessor", "DiaClassifierFreeGuidanceLogitsProcessor",
    "DiaEOSChannelFilterLogitsProcessor", "DiaEOSDelayPatternLogitsProcessor") if hasattr(lp, name))
# model_kwargs that transformers prepares for its own loop; the engine keeps its own cache and positions
_IGNORED_MODEL_KWARGS = ("attention_mask", "use_cache", "logits_to_keep", "position_ids", "cache",
                         "past_key_values", "cache_position")
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {spec or (spec, home): Drafter}
_GENERATE_CODE = inspect.unwrap(GenerationMixin.generate).__code__  # the frame that calls a custom_generate


@dataclass
class MentoredGenerateOutput(GenerateDecoderOnlyOutput):
    """``GenerateDecoderOnlyOutput`` plus mentored decoding's counters.

    Attributes
    ----------
    sequences : torch.LongTensor of shape (B, T + N)
        As transformers returns them (rows that stopped early padded with the pad token).
    num_new_tokens : torch.LongTensor of shape (B,)
        New tokens per row (an EOS token included).
    stats : GenerationStats
        The engine's counters: acceptance, mean accepted length, realized divergence, timing.
    """

    num_new_tokens: torch.LongTensor | None = None
    stats: GenerationStats | None = None


def mentored_generate(
    model,
    input_ids: torch.LongTensor,  # [B, T]
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    *,
    drafter=None,
    max_divergence: float = 0.0,
    min_acceptance: float | None = None,
    divergence="kl",
    num_draft_tokens: int = 4,
    md_top_k: int | None = None,
    md_solve: str = DEFAULT_MD_SOLVE,
    mentor=None,
    rule=None,
    generator: torch.Generator | None = None,
    streamer=None,
    home=None,
    **model_kwargs,
):
    """Mentored (or, with budget 0, lossless speculative) decoding as a ``custom_generate``.

    Parameters
    ----------
    model : transformers causal LM
        The target (``q``); transformers passes the model ``generate`` was called on.
    input_ids : torch.LongTensor of shape (B, T)
        Prompts, left-padded where ``attention_mask`` (in ``model_kwargs``) says so.
    logits_processor, stopping_criteria, generation_config
        What transformers prepared from the call (see the module docstring for how each is used).
    drafter : str, transformers model, mdboost Drafter or NgramDrafter
        A pool spec built from the target (``"ngram:3"``, ``"early_exit:12"``, ``"tuned:12"``,
        ``"int8"``; any other string is loaded as a model name or path), a causal LM sharing
        the target's vocabulary, or a :class:`~mdboost.engine.Drafter`
        (see :func:`drafter_for`).
    max_divergence, min_acceptance, divergence, md_top_k, md_solve
        The MD budget (:class:`~mdboost.engine.GenerationSettings`); budget 0 is lossless SD.
    mentor : callable or None
        An explicit emitted distribution per drafted position instead of a budget
        (:class:`~mdboost.engine.GenerationSettings`'s ``mentor``, e.g.
        :class:`mdboost.md.tv_set.BoostedMentor`).
    rule : mdboost.md.rules.Rule or None
        A verification rule instead of a budget (:class:`~mdboost.engine.GenerationSettings`'s
        ``rule``: ``Threshold(accept=c)`` for SGLang's thresholds, ``Match()`` for llama.cpp's
        verification, ``Rejection(drafting="greedy")`` for vLLM's default, ...).
    num_draft_tokens : int, default=4
        Draft length per step (the engine's ``gamma``).
    generator : torch.Generator or None
        Source of randomness (``None``: torch's global generator, as transformers samples).
    streamer : transformers streamer or None
        Receives each step's tokens (one row only), then ``end()`` (also when the call fails).
        transformers 5.x puts the prompt into ``generate(streamer=...)`` and then calls a
        callable ``custom_generate`` without it; the streamer is then read from that
        ``generate`` call (:func:`streamer_given_to_generate`).
    home : path or None
        The mdboost home of a ``drafter`` spec's translators and models (:func:`drafter_for`'s
        ``home``: a ranking's ``pool.home``, as ``mdboost export`` writes it); None: the default.

    Returns
    -------
    torch.LongTensor of shape (B, T + N), or MentoredGenerateOutput with ``return_dict_in_generate``.
    """
    if streamer is None:
        streamer = streamer_given_to_generate(sys._getframe(1))
    with _ended(streamer):
        return _mentored_generate(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                  drafter=drafter, max_divergence=max_divergence, min_acceptance=min_acceptance,
                                  divergence=divergence, num_draft_tokens=num_draft_tokens, md_top_k=md_top_k,
                                  md_solve=md_solve, mentor=mentor, rule=rule, generator=generator, streamer=streamer,
                                  home=home, model_kwargs=model_kwargs)


def streamer_given_to_generate(caller):
    """The ``streamer`` of the ``GenerationMixin.generate`` call running in frame ``caller``, or None.

    transformers 5.x forwards to a callable ``custom_generate`` only the keywords its signature
    names and ``GenerationMixin._sample``'s does not (``_extract_generation_mode_kwargs``);
    ``streamer`` is one of ``_sample``'s, so it never arrives, although ``generate`` has already
    put the prompt into it. A ``TextIteratorStreamer`` consumer then waited forever for the
    ``end()`` that only ``_sample`` calls. ``mentored_generate`` is called from ``generate``'s own
    frame (``result = decoding_method(self, input_ids, ...)``), so the streamer is read there.
    Any other caller (a direct call): None.
    """
    if caller is None or caller.f_code is not _GENERATE_CODE:
        return None
    return caller.f_locals.get("streamer")


@contextlib.contextmanager
def _ended(streamer):
    """Call ``streamer.end()`` on the way out, an error included: a consumer of a
    ``TextIteratorStreamer`` stops instead of waiting for tokens that will never come."""
    try:
        yield
    finally:
        if streamer is not None:
            streamer.end()


def _mentored_generate(model, input_ids, logits_processor, stopping_criteria, generation_config, *, drafter,
                       max_divergence, min_acceptance, divergence, num_draft_tokens, md_top_k, md_solve, mentor,
                       rule, generator, streamer, home, model_kwargs):
    config = generation_config if generation_config is not None else model.generation_config
    _check_call(model, input_ids, config, model_kwargs, streamer)
    if drafter is None:
        raise ValueError("drafter is required (a pool spec such as 'ngram:3', a model or a Drafter); "
                         "for plain decoding call generate without custom_generate")
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be a positive integer, got {num_draft_tokens!r}")
    batch = input_ids.shape[0]
    if logits_processor is None and stopping_criteria is None:  # a direct call: what generate builds from config
        logits_processor, stopping_criteria = from_config(config)
    sampling, processors = split_sampling(logits_processor, bool(config.do_sample))
    _check_processors(processors, batch)
    max_length, eos_id, criteria = split_stopping(stopping_criteria, config, input_ids.shape[1])
    pad = config._pad_token_tensor if getattr(config, "_pad_token_tensor", None) is not None else config.pad_token_id
    settings = GenerationSettings(
        max_new_tokens=_max_new_tokens(max_length, input_ids.shape[1]), gamma=num_draft_tokens, **sampling,
        max_divergence=max_divergence, min_acceptance=min_acceptance, divergence=divergence, md_top_k=md_top_k,
        md_solve=md_solve, mentor=mentor, rule=rule, eos_token_id=eos_id, pad_token_id=None if pad is None else int(pad),
        logits_processor=lp.LogitsProcessorList(processors) if processors else None,
        stopping_criteria=criteria)
    def stream(rows):  # one row (checked): [1, n] per step, as transformers' assisted decoding puts them
        if rows[0]:
            streamer.put(torch.tensor([rows[0]], dtype=torch.long))

    out = engine_generate(model, input_ids, settings, drafter=drafter_for(model, drafter, home=home),
                          attention_mask=model_kwargs.get("attention_mask"), generator=generator,
                          on_tokens=stream if streamer is not None else None)
    if config.return_dict_in_generate:
        return MentoredGenerateOutput(sequences=out.sequences, num_new_tokens=out.num_new_tokens, stats=out.stats)
    return out.sequences


def _check_call(model, input_ids, config, model_kwargs, streamer) -> None:
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("mentored_generate supports decoder-only models, got an encoder-decoder model")
    if (config.num_beams or 1) > 1:
        raise ValueError(f"mentored_generate samples one sequence per row: num_beams must be 1, got {config.num_beams}")
    if config.return_dict_in_generate:
        for name in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
            if getattr(config, name, False):
                raise ValueError(f"{name}=True is not supported by mentored_generate (it returns sequences and "
                                 f"MD statistics only)")
    extra = sorted(k for k, v in model_kwargs.items() if k not in _IGNORED_MODEL_KWARGS and v is not None)
    if extra:
        raise ValueError(f"mentored_generate takes token prompts only; unsupported model inputs: {extra}")
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise ValueError("mentored_generate starts from an empty cache; got a cache holding "
                         f"{cache.get_seq_length()} tokens")
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(f"streamer needs a batch of one row, got {input_ids.shape[0]} rows")
    if getattr(config, "cache_implementation", None) is not None:
        warnings.warn(f"cache_implementation={config.cache_implementation!r} is ignored by mentored_generate: "
                      "mdboost's engine keeps its own dynamic KV cache, rolled back after each verification, "
                      "and returns no cache", UserWarning, stacklevel=4)


def from_config(config) -> tuple[list, list]:
    """The sampling warpers and the EOS criterion ``generate`` builds from ``config``, for a direct call.

    ``generate`` hands ``custom_generate`` the processors and criteria it built from the whole
    config; a direct call (both None) gets these from the config's ``do_sample``,
    ``temperature``, ``top_k``, ``top_p`` (in ``generate``'s order and with its rule for
    defaults) and ``eos_token_id``. Other processors of the config (``repetition_penalty``, ...)
    are built only by ``generate``.

    >>> from transformers import GenerationConfig
    >>> warpers, criteria = from_config(GenerationConfig(do_sample=True, temperature=0.7, top_k=5, eos_token_id=2))
    >>> split_sampling(warpers, do_sample=True)
    ({'temperature': 0.7, 'top_k': 5, 'top_p': None}, [])
    >>> [type(c).__name__ for c in criteria]
    ['EosTokenCriteria']
    """
    warpers = []
    if config.do_sample:
        if config.temperature is not None and config.temperature != 1.0:
            warpers.append(lp.TemperatureLogitsWarper(config.temperature))
        if config.top_k is not None and config.top_k != 0:
            warpers.append(lp.TopKLogitsWarper(config.top_k))
        if config.top_p is not None and config.top_p < 1.0:
            warpers.append(lp.TopPLogitsWarper(config.top_p))
    eos = config.eos_token_id
    criteria = [] if eos is None else [EosTokenCriteria(eos)]
    return warpers, criteria


def split_sampling(processors, do_sample: bool) -> tuple[dict, list]:
    """``(engine sampling settings, the processors left to run as a hook)``.

    Greedy (``do_sample=False``) is temperature 0 with every processor as a hook. Sampling
    takes a trailing ``TopP``, then ``TopK``, then ``Temperature`` warper (in that order from
    the end, each kept only with ``min_tokens_to_keep=1`` and a ``-inf`` filter: the
    definitions of :func:`mdboost.logits_to_probs`) as the engine's own settings.

    >>> from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper
    >>> split_sampling([TemperatureLogitsWarper(0.7), TopKLogitsWarper(50)], do_sample=True)
    ({'temperature': 0.7, 'top_k': 50, 'top_p': None}, [])
    >>> split_sampling([TopKLogitsWarper(50)], do_sample=False)[0]
    {'temperature': 0.0, 'top_k': None, 'top_p': None}
    """
    rest = list(processors or [])
    sampling = {"temperature": 0.0 if not do_sample else 1.0, "top_k": None, "top_p": None}
    if not do_sample:
        return sampling, rest
    plain = lambda w: getattr(w, "min_tokens_to_keep", 1) == 1 and w.filter_value == -float("inf")  # noqa: E731
    for cls, key, attr in ((lp.TopPLogitsWarper, "top_p", "top_p"), (lp.TopKLogitsWarper, "top_k", "top_k")):
        if rest and type(rest[-1]) is cls and plain(rest[-1]):
            sampling[key] = getattr(rest.pop(), attr)
    if rest and type(rest[-1]) is lp.TemperatureLogitsWarper:
        sampling["temperature"] = float(rest.pop().temperature)
    return sampling, rest


def _check_processors(processors, batch: int) -> None:
    for proc in processors:
        if isinstance(proc, _STATEFUL_PROCESSORS):
            raise ValueError(f"{type(proc).__name__} keeps state from one call to the next, one call per generated "
                             f"token (e.g. guidance_scale, a SynthID watermarking_config); the engine calls the "
                             f"processors at every drafted and verified position, so it is not supported")
        padded = isinstance(proc, lp.RepetitionPenaltyLogitsProcessor) and torch.is_tensor(proc.prompt_ignore_length)
        if padded or (batch > 1 and isinstance(proc, _ONE_ROW_PROCESSORS)):
            raise ValueError(f"{type(proc).__name__} reads each row's length or padding, which the engine's rows "
                             f"(advancing at different speeds) do not share in a batch: generate one row at a "
                             f"time, or drop it (batch of {batch} rows)")


def split_stopping(criteria, config,
                   prompt_length: int | None = None) -> tuple[int, int | None, StoppingCriteriaList | None]:
    """``(max_length, single EOS id or None, criteria left to run as a hook or None)``.

    ``config.max_new_tokens`` takes precedence over ``config.max_length``, as in transformers
    (which turns it into ``max_length`` before calling ``custom_generate``; a direct call
    gives it here, with the ``prompt_length``).
    """
    max_length = config.max_length
    new = getattr(config, "max_new_tokens", None)
    if new is not None and prompt_length is not None:
        max_length = prompt_length + int(new)
    rest, eos_id = [], None
    for c in criteria or []:
        if isinstance(c, MaxLengthCriteria):
            max_length = min(max_length, c.max_length) if max_length is not None else c.max_length
            continue
        if isinstance(c, EosTokenCriteria):
            ids = torch.as_tensor(c.eos_token_id).reshape(-1).tolist()
            if len(ids) == 1 and eos_id is None:
                eos_id = int(ids[0])
                continue
        rest.append(c)
    if max_length is None:
        raise ValueError("generation_config.max_length is None: give max_new_tokens or max_length")
    return max_length, eos_id, StoppingCriteriaList(rest) if rest else None


def _max_new_tokens(max_length: int, prompt_length: int) -> int:
    if max_length <= prompt_length:
        raise ValueError(f"max_length ({max_length}) must exceed the prompt length ({prompt_length}): "
                         "give max_new_tokens")
    return max_length - prompt_length


def drafter_for(target, drafter, *, tokenizer=None, home=None) -> Drafter:
    """The :class:`~mdboost.engine.Drafter` for ``drafter``, built from ``target`` when it is a spec.

    Parameters
    ----------
    target : transformers causal LM
    drafter : str, Drafter, transformers model or NgramDrafter
        Specs as in :func:`mdboost.models.pool.build_pool`: ``"ngram:N"``, ``"early_exit:N"``,
        ``"tuned:N"`` (translators read from where the pool stores them, or fitted on the
        bundled text), ``"int8"`` (CPU); another string is a model name or path. Built
        drafters are kept per target, so repeated calls do not rebuild them.
    tokenizer : tokenizer or None
        Only for fitting a ``tuned:N`` translator not stored yet (default: the target's own,
        loaded from its ``name_or_path``).
    home : path or None
        The mdboost home (:func:`mdboost.models.home.mdboost_home`) where ``tuned:N``
        translators of a Hub or local target are stored and a named drafter model is converted,
        as ``build_pool(home=...)`` keeps them (None: ``MDBOOST_HOME``, else
        ``~/.cache/mdboost``). A target loaded from its converted folder (the default
        ``smollm2-135m``) keeps its translators in that folder, whatever ``home`` says.
    """
    if not isinstance(drafter, str):
        return as_drafter(drafter)
    built = _BUILT.setdefault(target, {})
    key = drafter if home is None else (drafter, os.fspath(home))
    if key not in built:
        built[key] = _from_spec(target, drafter, tokenizer, home)
    return built[key]


def _from_spec(target, spec: str, tokenizer, home=None) -> Drafter:
    kind, n = parse_drafter(spec)
    try:
        if kind == "ngram":
            return NgramAdapter(NgramDrafter(n))
        if kind == "early_exit":
            return ModelDrafter(early_exit_model(target, n))
        if kind == "tuned":
            return ModelDrafter(early_exit_model(target, n, _translator(target, n, tokenizer, home)))
        if kind == "int8":
            return ModelDrafter(int8_model(target))
    except ValueError as err:
        raise ValueError(f"drafter {spec!r}: {err}") from err

    model, _ = load_model(spec, device=target.device, dtype=target.dtype, home=home)
    return ModelDrafter(model)


def _translator(target, n: int, tokenizer, home=None):
    """The ``tuned:n`` translator where :func:`~mdboost.models.pool.build_pool` keeps it (same fit)."""
    name = str(getattr(target, "name_or_path", "") or "")
    if name and Path(name).is_dir() and is_converted(name):
        store = name  # the converted default model keeps its translators next to its weights
    else:
        store = tuned_store(name, home) if name else None
    return tuned_translators(target, [n], lambda: fit_sequences(tokenizer or _tokenizer_of(target, name)),
                             store=store)[n]


def _tokenizer_of(target, name: str):
    if name.startswith("tiny-llama"):
        return tiny_tokenizer(target.config.vocab_size)
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise ValueError(f"a tuned drafter needs the target's tokenizer to fit its translator and none loads from "
                         f"{name!r}: pass drafter=mdboost.hf.drafter_for(target, 'tuned:N', tokenizer=tok)") from err
