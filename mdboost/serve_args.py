"""Command lines of the serving engines for one operating point: ``vllm serve``, SGLang's
``launch_server`` and llama.cpp's ``llama-server``.

Pure functions of explicit values (model paths, draft length, acceptance thresholds, sampling);
which point to serve is :mod:`mdboost.export`'s choice. Every flag is the engine's own in its
pinned release (vLLM 0.34.0, SGLang 0.5.23, llama.cpp as vendored by llama-cpp-python 0.3.36):
``bench/engine_schemas.py`` reads them from the released sources into
``tests/data/engine_schemas.json``, and ``tests/test_export_schemas.py`` checks every flag and
value emitted here against that file.

The served sampling equals the ranked one only where the server's own defaults do not replace
it, so each command line sets them:

- vLLM's server takes a request's own value, else the server default, else OpenAI's
  (``entrypoints/openai/completion/protocol.py:367-375``), and the server default is the
  model's ``generation_config.json`` unless ``--generation-config vllm``, plus
  ``--override-generation-config`` (``config/model.py:1899-1904``);
- SGLang's OpenAI endpoints use the model's ``generation_config.json`` unless
  ``--sampling-defaults openai`` (``srt/configs/model_config.py:2210-2240``); its
  ``--preferred-sampling-params`` fill what a request leaves out
  (``srt/managers/tokenizer_manager.py:1549-1550``);
- ``llama-server`` samples with ``top_k 40, top_p 0.95, min_p 0.05, temp 0.8`` unless told
  otherwise (``common/common.h:232-238``).
"""

from __future__ import annotations

import json
import math

SGLANG_ALGORITHM = "STANDALONE"  # a separate draft model (srt/speculative/standalone_worker_v2.py:37)
LLAMACPP_DRAFT_TYPE = "draft-simple"  # a separate draft model (common/speculative.cpp:190)
LLAMACPP_NGRAM_TYPE = "ngram-simple"  # prompt lookup of one n-gram size (common/ngram-map.cpp:49)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _sampling(temperature, top_k, top_p) -> tuple[float, int | None, float | None]:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if top_k is not None:
        _positive_int("top_k", top_k)
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
    return float(temperature), top_k, None if top_p is None else float(top_p)


def _threshold(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= 1 and math.isfinite(value)):
        raise ValueError(f"{name} must be in (0, 1] (1: lossless), got {value!r}")
    return float(value)


def vllm_serve_args(model: str, sampling: dict, speculative_config: dict | None = None) -> list[str]:
    """``vllm serve`` argv serving ``model`` with ``sampling`` as the server's defaults.

    ``sampling``: ``SamplingParams`` keywords among those ``--override-generation-config``
    applies (``temperature``, ``top_k``, ``top_p``, ...); ``speculative_config``: the
    ``--speculative-config`` JSON, or None.

    >>> vllm_serve_args("m", {"temperature": 0.7})
    ['vllm', 'serve', 'm', '--generation-config', 'vllm', '--override-generation-config', '{"temperature": 0.7}']
    """
    args = ["vllm", "serve", model, "--generation-config", "vllm", "--override-generation-config", json.dumps(sampling)]
    if speculative_config is not None:
        args += ["--speculative-config", json.dumps(speculative_config)]
    return args


def sglang_args(model: str, *, draft_model: str | None = None, num_draft_tokens: int | None = None,
                accept: float = 1.0, single: float = 1.0, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None) -> list[str]:
    """``python -m sglang.launch_server`` argv for ``model``, drafted by ``draft_model`` (or not).

    Parameters
    ----------
    model, draft_model : str
        What SGLang loads (a folder or a hub name); ``draft_model=None``: plain decoding.
    num_draft_tokens : int
        Draft length per step (mdboost's ``gamma``): SGLang's ``--speculative-num-steps``, one
        chain (``--speculative-eagle-topk 1``) of ``gamma + 1`` tokens with the verified one.
    accept, single : float in (0, 1]
        ``--speculative-accept-threshold-acc`` ``c`` and ``-single`` ``s``: a draft ``x`` is
        accepted with probability ``min(1, q_x / c)``, always when ``q_x >= s``
        (``sgl_kernel/speculative/sampling.cuh:77-81``); ``c = s = 1``: accepted with
        probability ``q_x``, lossless.
    temperature, top_k, top_p
        The sampling the server applies to a request that sets none (``top_k``/``top_p`` None:
        unfiltered).

    Notes
    -----
    SGLang drafts the drafter's top-1 token (greedy: ``fast_topk`` in ``draft_forward``,
    ``srt/speculative/eagle_worker_v2.py:887``) and verifies it as a one-hot draft (target-only
    sampling): sampled drafts need ``--speculative-use-rejection-sampling``, which only EAGLE /
    EAGLE3 take (``srt/arg_groups/speculative_hook.py:1215``).

    >>> sglang_args("t", draft_model="d", num_draft_tokens=4, temperature=0.7)[3:13]
    ['--model-path', 't', '--speculative-algorithm', 'STANDALONE', '--speculative-draft-model-path', 'd', \
'--speculative-num-steps', '4', '--speculative-eagle-topk', '1']
    """
    temperature, top_k, top_p = _sampling(temperature, top_k, top_p)
    accept, single = _threshold("accept", accept), _threshold("single", single)
    args = ["python", "-m", "sglang.launch_server", "--model-path", model]
    if draft_model is not None:
        gamma = _positive_int("num_draft_tokens", num_draft_tokens)
        args += ["--speculative-algorithm", SGLANG_ALGORITHM, "--speculative-draft-model-path", draft_model,
                 "--speculative-num-steps", str(gamma), "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(gamma + 1),
                 "--speculative-accept-threshold-acc", f"{accept:g}",
                 "--speculative-accept-threshold-single", f"{single:g}"]
    preferred = {"temperature": temperature, "top_k": -1 if top_k is None else top_k,
                 "top_p": 1.0 if top_p is None else top_p}  # SGLang's top_k -1: the whole vocabulary
    return args + ["--sampling-defaults", "openai", "--preferred-sampling-params", json.dumps(preferred)]


def llamacpp_args(model: str, *, draft_model: str | None = None, ngram: int | None = None,
                  draft_max: int | None = None, draft_min: int = 0, draft_p_min: float = 0.0,
                  temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> list[str]:
    """``llama-server`` argv for the GGUF ``model``, drafted by a GGUF ``draft_model``, by
    prompt lookup of ``ngram`` tokens, or not at all.

    Parameters
    ----------
    model, draft_model : str
        GGUF files (llama.cpp loads nothing else).
    ngram : int or None
        Instead of a draft model: ``--spec-type ngram-simple`` looking up the last ``ngram``
        tokens (``--spec-ngram-simple-size-n``) and drafting up to ``draft_max`` tokens
        (``--spec-ngram-simple-size-m``).
    draft_max, draft_min : int
        ``--spec-draft-n-max`` / ``--spec-draft-n-min`` (mdboost's ``gamma`` and 0).
    draft_p_min : float in [0, 1)
        ``--spec-draft-p-min``: drafting stops before a draft whose top-10 probability is below
        it (``common/speculative.cpp:366``; a rule's ``draft_p_min``,
        :func:`mdboost.md.drafting.draft_confidence`); 0: always ``draft_max`` tokens.
    temperature, top_k, top_p
        The server's sampling: ``--temp``, ``--top-k`` (0: off), ``--top-p`` (1: off) and
        ``--min-p 0`` (llama-server's default 0.05 would filter what mdboost's ranking did not).

    Notes
    -----
    llama.cpp drafts the drafter's most likely token (``common/speculative.cpp:361``) and
    accepts while the target's own sample equals the draft (``common/sampling.cpp:688-697``):
    acceptance ``q_x`` for a one-hot draft, lossless.

    >>> llamacpp_args("t.gguf", draft_model="d.gguf", draft_max=4, temperature=0.7)[:8]
    ['llama-server', '-m', 't.gguf', '--spec-type', 'draft-simple', '--spec-draft-model', 'd.gguf', '--spec-draft-n-max']
    """
    temperature, top_k, top_p = _sampling(temperature, top_k, top_p)
    if draft_model is not None and ngram is not None:
        raise ValueError(f"give draft_model or ngram, not both (got {draft_model!r} and {ngram!r})")
    args = ["llama-server", "-m", model]
    if draft_model is not None or ngram is not None:
        gamma = _positive_int("draft_max", draft_max)
        if isinstance(draft_min, bool) or not isinstance(draft_min, int) or not 0 <= draft_min <= gamma:
            raise ValueError(f"draft_min must be an integer in [0, draft_max={gamma}], got {draft_min!r}")
        if isinstance(draft_p_min, bool) or not isinstance(draft_p_min, (int, float)) or not 0 <= draft_p_min < 1:
            raise ValueError(f"draft_p_min must be a number in [0, 1), got {draft_p_min!r}")
        if ngram is not None:
            args += ["--spec-type", LLAMACPP_NGRAM_TYPE, "--spec-ngram-simple-size-n", str(_positive_int("ngram", ngram)),
                     "--spec-ngram-simple-size-m", str(gamma)]
        else:
            args += ["--spec-type", LLAMACPP_DRAFT_TYPE, "--spec-draft-model", draft_model,
                     "--spec-draft-n-max", str(gamma), "--spec-draft-n-min", str(draft_min),
                     "--spec-draft-p-min", f"{float(draft_p_min):g}"]
    return args + ["--temp", f"{temperature:g}", "--top-k", str(0 if top_k is None else top_k),
                   "--top-p", f"{1.0 if top_p is None else top_p:g}", "--min-p", "0"]
