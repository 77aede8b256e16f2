"""The Python of a point: :func:`mdboost_snippet` (mdboost's engine), :func:`hf_snippet` and
:func:`hf_kwargs` (Hugging Face ``generate``), and the pieces the other engines' snippets share."""

from __future__ import annotations

from mdboost.ranking.recommend import md_row
from mdboost.ranking.report import ALONE

PROMPT = "def fib(n):"
MAX_NEW_TOKENS = 64


def _settings_args(rec: dict, sampling: dict) -> list[str]:
    args = [f"temperature={float(rec['temperature']):g}"]
    args += [f"{k}={v!r}" for k, v in sampling.items() if v is not None]
    return args


def _budget_args(rec: dict) -> list[str]:
    rule = rule_code(rec)
    if rule is not None:
        return [f"rule={rule}"]
    if float(rec["max_divergence"]) == 0:
        return []
    return [f"max_divergence={float(rec['max_divergence']):g}", f"divergence={rec['divergence']!r}"]


def rule_code(rec: dict) -> str | None:
    """The Python of a point's verification rule (:func:`mdboost.ranking.rule_points.row_rule`),
    or None for MD on sampled drafts (the budget arguments say it).

    >>> rule_code({"rule": "threshold", "drafting": "greedy", "divergence": "kl", "max_divergence": 0.0})
    "Threshold(drafting='greedy', accept=1.0, single=1.0)"
    >>> rule_code({"rule": "match", "drafting": "greedy", "draft_p_min": 0.5, "divergence": "none", "max_divergence": 0.0})
    "Match(drafting='greedy', draft_p_min=0.5)"
    """
    if md_row(rec):
        return None
    # deferred: the rules are torch code (a second to import); most of an export needs none
    from mdboost.ranking.rule_points import row_rule

    return repr(row_rule(rec))


def _rule_import(rec: dict) -> list[str]:
    rule = rule_code(rec)
    return [] if rule is None else [f"from mdboost.md.rules import {rule.split('(')[0]}"]


def _home_arg(home: str | None) -> str:
    """The snippets' ``, home=...`` argument (none for the default home)."""
    return "" if home is None else f", home={home!r}"


def _load_target(rec: dict, device: str, home: str | None) -> str:
    """The snippets' ``load_model`` line: the target converted (or found) in the ranking's home."""
    return f"target, tok = load_model({rec['target']!r}, device={device!r}{_home_arg(home)})"


def mdboost_snippet(rec: dict, sampling: dict, device: str, home: str | None = None) -> str:
    """Python running the recommendation with :func:`mdboost.engine.generate`; ``home``: the
    ranking's mdboost home (its converted models and tuned translators), None for the default.
    The drafter alone (rule ``"alone"``) decodes with the drafter's model, the target unused."""
    if rec["beats_plain_decoding"] and rec.get("rule") == ALONE:
        return _alone_snippet(rec, sampling, device, home)
    speculative = rec["beats_plain_decoding"]
    args = [f"max_new_tokens={MAX_NEW_TOKENS}", *_settings_args(rec, sampling)]
    if speculative:
        args += [f"gamma={int(rec['gamma'])}", *_budget_args(rec)]
    call = (f"out = generate(target, input_ids, settings, "
            f"drafter=drafter_for(target, {rec['drafter']!r}{_home_arg(home)}))"
            if speculative else "out = generate(target, input_ids, settings)  # plain decoding: no drafter pays off")
    return "\n".join([
        "from mdboost.engine import GenerationSettings, generate",
        *(["from mdboost.hf import drafter_for"] if speculative else []),
        *(_rule_import(rec) if speculative else []),
        "from mdboost.models import load_model", "",
        _load_target(rec, device, home),
        f"input_ids = tok({PROMPT!r}, return_tensors=\"pt\").input_ids.to(target.device)",
        f"settings = GenerationSettings({', '.join(args)}, eos_token_id=tok.eos_token_id)",
        call, "print(tok.decode(out.sequences[0]))"])


def _alone_snippet(rec: dict, sampling: dict, device: str, home: str | None) -> str:
    args = [f"max_new_tokens={MAX_NEW_TOKENS}", *_settings_args(rec, sampling)]
    return "\n".join([
        "from mdboost.engine import GenerationSettings, generate",
        "from mdboost.models import build_pool", "",
        f"pool = build_pool({rec['target']!r}, [{rec['drafter']!r}], device={device!r}{_home_arg(home)})",
        f"model, tok = pool[{rec['drafter']!r}].model, pool.target.tokenizer  # the drafter alone: no target step",
        f"input_ids = tok({PROMPT!r}, return_tensors=\"pt\").input_ids.to(model.device)",
        f"settings = GenerationSettings({', '.join(args)}, eos_token_id=tok.eos_token_id)",
        "out = generate(model, input_ids, settings)", "print(tok.decode(out.sequences[0]))"])


def hf_kwargs(rec: dict, sampling: dict, home: str | None = None) -> dict:
    """Keyword arguments of ``target.generate`` for the recommendation, next to
    ``custom_generate=mdboost.hf.mentored_generate`` when drafted (a callable, so not among them:
    transformers reads a string there as a Hub repository); ``home``: the ranking's mdboost home,
    passed on to :func:`mdboost.hf.mentored_generate` with the drafter (None: left out)."""
    sampled = float(rec["temperature"]) > 0
    kwargs = {"do_sample": sampled, "max_new_tokens": MAX_NEW_TOKENS}
    if sampled:  # top_k=0: the ranking's unfiltered sampling (transformers' default with do_sample is top_k=50)
        kwargs["temperature"] = float(rec["temperature"])
        kwargs["top_k"] = 0 if sampling.get("top_k") is None else sampling["top_k"]
        if sampling.get("top_p") is not None:
            kwargs["top_p"] = sampling["top_p"]
    if not rec["beats_plain_decoding"]:
        return kwargs
    md = {"drafter": rec["drafter"], "num_draft_tokens": int(rec["gamma"])}
    if home is not None:
        md["home"] = home
    if rule_code(rec) is None and float(rec["max_divergence"]) > 0:
        md.update(max_divergence=float(rec["max_divergence"]), divergence=rec["divergence"])
    return {**md, **kwargs}


CUSTOM_GENERATE = "mdboost.hf:mentored_generate"  # the import path (module:attribute) of the hf section's callable


def hf_snippet(rec: dict, sampling: dict, device: str, home: str | None = None) -> str:
    """Python running the recommendation through Hugging Face ``generate`` (``home``: as
    :func:`mdboost_snippet`'s)."""
    kwargs = hf_kwargs(rec, sampling, home)
    drafted = bool(rec["beats_plain_decoding"])
    args = ["**inputs"] + (["custom_generate=mdboost.hf.mentored_generate"] if drafted else [])
    args += [f"{k}={v!r}" for k, v in kwargs.items()]
    rule = rule_code(rec) if drafted else None
    if rule is not None:  # the rule object, not a keyword's value: hf_kwargs (JSON) leaves it out
        args.append(f"rule={rule}")
    lines = [f"{args[0]}"]
    for arg in args[1:]:  # wrap the call at about 100 columns
        if len(lines[-1]) + len(arg) > 70:
            lines.append(arg)
        else:
            lines[-1] += f", {arg}"
    call = ",\n                      ".join(lines)
    return "\n".join([*(["import mdboost.hf"] if drafted else []), *(_rule_import(rec) if rule else []),
                      "from mdboost.models import load_model", "",
                      _load_target(rec, device, home),
                      f"inputs = tok({PROMPT!r}, return_tensors=\"pt\").to(target.device)",
                      f"out = target.generate({call})", "print(tok.decode(out[0]))"])
