"""The model pool: a target plus drafters that share its vocabulary, each with a cost ratio.

Drafter specs: ``early_exit:N``, ``tuned:N``, ``int8``, ``ngram:N`` (see
:mod:`mdboost.models.drafters` and :mod:`mdboost.models.ngram`) or another model name / path.
Every member records a vocabulary fingerprint; a drafter/target pair with different
vocabularies is refused (no silent mis-mapping of token ids). Members loaded from a local
folder, a file or the hub also record their weights' content id
(:func:`mdboost.models.identity.weights_id`, ``info["weights"]``), which keys their caches
and the target's stored tuned lenses (:func:`tuned_store`). Cost ratios ``c`` (drafter
step time / target step time, the speed model of
``docs/theory.md``, "Speed model for ranking") are measured by
:func:`mdboost.models.cost.measure_cost_ratio`.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mdboost._io import sha256_file
from mdboost.data import fit_sequences

from .convert import SMOLLM2_ALIAS, ensure_smollm2
from .cost import measure_cost_ratio
from .drafters import early_exit_model, int8_model, tuned_translators
from .home import models_dir
from .identity import TINY_NAME, weights_id
from .loading import load_model, resolve_device
from .ngram import NgramDrafter
from .sources import check_drafter, target_depth  # noqa: F401 -- re-exported (pool specs are checked here)
from .specs import parse_drafter

KINDS = ("hf", "early_exit", "tuned", "int8", "ngram")
DEFAULT_DEPTHS = (12, 18, 24, 27)
DEFAULT_DRAFTERS = tuple(
    [f"early_exit:{n}" for n in DEFAULT_DEPTHS] + [f"tuned:{n}" for n in DEFAULT_DEPTHS] + ["int8", "ngram:3"]
)


@dataclass
class PoolMember:
    """One model of the pool (the target or a drafter).

    Attributes
    ----------
    name : str -- the spec it was built from (``"smollm2-135m"``, ``"early_exit:12"``, ...).
    kind : {"hf", "early_exit", "tuned", "int8", "ngram"}
    model : transformers causal LM, or None for ``ngram``.
    ngram : NgramDrafter or None.
    tokenizer : the (shared) tokenizer.
    vocab_fingerprint : str -- see :func:`vocab_fingerprint`.
    cost_ratio : float or None -- drafter/target per-token decode time (1.0 for the target).
    cost_method : str -- how ``cost_ratio`` was obtained.
    model_id : str -- what the member is, for manifests (``"<target>#early_exit:12"``, ...).
    """

    name: str
    kind: str
    model: object | None
    ngram: NgramDrafter | None
    tokenizer: object
    vocab_fingerprint: str
    cost_ratio: float | None = None
    cost_method: str = "not measured"
    model_id: str = ""
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if (self.kind == "ngram") != (self.model is None):
            raise ValueError(f"member {self.name!r}: kind {self.kind!r} needs model={'None' if self.kind == 'ngram' else 'a model'}")

    def describe(self) -> dict:
        """JSON-able summary (for manifests and tracking)."""
        return {"name": self.name, "kind": self.kind, "model_id": self.model_id or self.name,
                "vocab_fingerprint": self.vocab_fingerprint, "cost_ratio": self.cost_ratio,
                "cost_method": self.cost_method, **self.info}


@dataclass
class Pool:
    """A target member and its drafters (all vocabulary-compatible with the target)."""

    target: PoolMember
    drafters: list[PoolMember]
    recipe: dict | None = None  # build_pool arguments: lets worker processes rebuild members

    @property
    def members(self) -> list[PoolMember]:
        return [self.target] + list(self.drafters)

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def __getitem__(self, name: str) -> PoolMember:
        for member in self.members:
            if member.name == name:
                return member
        raise KeyError(f"no pool member named {name!r}; members: {self.names}")

    def __len__(self) -> int:
        return len(self.members)

    @staticmethod
    def pair_compatible(a: PoolMember, b: PoolMember) -> bool:
        """True when ``a`` and ``b`` share the vocabulary (same fingerprint)."""
        return a.vocab_fingerprint == b.vocab_fingerprint

    @staticmethod
    def check_compatible(a: PoolMember, b: PoolMember) -> None:
        """Raise ``ValueError`` naming both members when their vocabularies differ."""
        if not Pool.pair_compatible(a, b):
            raise ValueError(
                f"vocabulary mismatch: {a.name!r} (fingerprint {a.vocab_fingerprint}) and "
                f"{b.name!r} (fingerprint {b.vocab_fingerprint}) do not share a tokenizer"
            )

    def measure_costs(self, **kwargs) -> None:
        """Measure and store every drafter's cost ratio (kwargs: see ``measure_cost_ratio``)."""
        self.target.cost_ratio, self.target.cost_method = 1.0, "target (reference)"
        for member in self.drafters:
            member.cost_ratio, member.cost_method = measure_cost_ratio(member, self.target, **kwargs)


def vocab_fingerprint(tokenizer, model=None) -> str:
    """SHA-256 (16 hex digits) of the token -> id map, plus the model's logit width."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    width = None if model is None else int(model.config.vocab_size)
    payload = json.dumps({"vocab": vocab, "logits": width}, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# How a kind's cached rows are computed, where it changed since caches were first keyed: part of
# the member's cache-folder key (mdboost.cache.keys), so a cache built the older way is rebuilt.
ROW_REVISIONS = {"int8": "rows: int8 weights, one activation scale per token (TokenScaledInt8Linear)"}


def row_revision(spec: str) -> str | None:
    """The :data:`ROW_REVISIONS` entry of a member spec's kind, or None (the original rows)."""
    return ROW_REVISIONS.get(parse_drafter(spec)[0])


DEFAULT_FIT = ("humaneval", 4096)  # build_pool's fit_source / fit_positions: the lenses stored directly in tuned_store


def tuned_store(target_name: str, home=None, fit: str | None = None) -> str | None:
    """Where the ``tuned`` translators of a target are stored, keyed on its weights' content.

    None for ``tiny`` (random tiny models: fitting is instant, nothing worth storing); the
    converted folder for ``smollm2-135m`` (converted again, without them, when its source
    changes); else ``<home>/models/tuned/<slug>[-<id>]``, ``<id>`` the first 16 hex digits of
    the SHA-256 of :func:`mdboost.models.identity.weights_id` (no suffix when that is None).
    ``fit``: the :func:`fit_key` of a fit other than :data:`DEFAULT_FIT`, whose lenses are in
    the ``fit-<fit>`` sub-folder of that store (None: the default fit's, in the store itself).
    """
    if TINY_NAME.fullmatch(target_name):
        return None
    if target_name.lower() == SMOLLM2_ALIAS:
        path = ensure_smollm2(home)
    else:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", target_name.strip("/"))
        content = weights_id(target_name, home)
        if content is not None:
            slug += "-" + hashlib.sha256(content.encode()).hexdigest()[:16]
        path = models_dir(home) / "tuned" / slug
        path.mkdir(parents=True, exist_ok=True)
    return str(path if fit is None else path / f"fit-{fit}")


def fit_key(fit_source: str, fit_positions: int) -> str | None:
    """None for the default fit (:data:`DEFAULT_FIT`), else 16 hex digits keying another one: its
    source (a local file by its content too) and positions. Lenses of another fit live in the
    ``fit-<key>`` sub-folder of the target's store, so one fitted on other text is never loaded."""
    if (fit_source, fit_positions) == DEFAULT_FIT:
        return None
    path = Path(fit_source).expanduser()
    content = sha256_file(path, memo=True) if path.is_file() else None
    return hashlib.sha256(json.dumps([fit_source, fit_positions, content]).encode()).hexdigest()[:16]


def _weights_info(name: str, home) -> dict:
    """``{"weights": <content id>}`` for manifests, empty where the id is None (names unchanged)."""
    content = weights_id(name, home)
    return {} if content is None else {"weights": content}


def build_pool(
    target: str,
    drafters: list[str] | tuple[str, ...] = DEFAULT_DRAFTERS,
    device=None,
    home: str | os.PathLike | None = None,
    *,
    dtype=None,
    measure_costs: bool = False,
    cost_kwargs: dict | None = None,
    fit_source: str = DEFAULT_FIT[0],
    fit_positions: int = DEFAULT_FIT[1],
) -> Pool:
    """Load the target and build its drafters.

    Parameters
    ----------
    target : str
        ``"smollm2-135m"``, ``"tiny"`` / ``"tiny:<seed>"``, a hub name or a local path/GGUF file.
    drafters : list or tuple of str
        Specs (see module docstring). Names must be unique. A single str is a TypeError.
    device, dtype, home : see :func:`mdboost.models.loading.load_model`.
    measure_costs : bool, default=False
        Measure every drafter's cost ratio now (else call ``pool.measure_costs()`` later).
    fit_source, fit_positions : text and number of positions for fitting ``tuned`` translators
        (stored lenses are keyed on them, :func:`fit_key`).
    """
    if not isinstance(drafters, (list, tuple)):  # a str would be read as its letters
        raise TypeError(f"drafters must be a list or tuple of drafter specs, got {type(drafters).__name__} "
                        f"{drafters!r}" + (f" (for one drafter: [{drafters!r}])" if isinstance(drafters, str) else ""))
    if len(set(drafters)) != len(drafters):
        raise ValueError(f"drafters must be unique, got {list(drafters)!r}")
    if target in drafters:  # it would be loaded twice, under the target's own member name
        raise ValueError(f"drafter {target!r} is the target itself; list other drafters")
    if isinstance(fit_positions, bool) or not isinstance(fit_positions, numbers.Integral) or fit_positions < 1:
        raise ValueError(f"fit_positions must be a positive integer, got {fit_positions!r}")
    device = resolve_device(device)
    model, tokenizer = load_model(target, device=device, dtype=dtype, home=home)
    fingerprint = vocab_fingerprint(tokenizer, model)
    target_member = PoolMember(target, "hf", model, None, tokenizer, fingerprint, 1.0, "target (reference)", target,
                               _weights_info(target, home))
    parsed = [(spec, *parse_drafter(spec)) for spec in drafters]
    tuned_depths = sorted({n for _, kind, n in parsed if kind == "tuned"})
    translators = {}
    if tuned_depths:
        fit = fit_key(fit_source, fit_positions)
        translators = tuned_translators(model, tuned_depths, lambda: fit_sequences(tokenizer, fit_source),
                                        store=tuned_store(target, home, fit), max_positions=fit_positions)
    members = []
    # drafters made of the target's own weights carry its content id (their manifest entries, like its own)
    derived = {} if "weights" not in target_member.info else {"target_weights": target_member.info["weights"]}
    for spec, kind, n in parsed:
        model_id = f"{target}#{spec}"
        if kind == "ngram":
            member = PoolMember(spec, kind, None, NgramDrafter(n), tokenizer, fingerprint, model_id=model_id)
        elif kind in ("early_exit", "tuned"):
            draft = early_exit_model(model, n, translators.get(n) if kind == "tuned" else None)
            info = {**derived, **({"tuned_fit": fit} if kind == "tuned" and fit is not None else {})}
            member = PoolMember(spec, kind, draft, None, tokenizer, fingerprint, model_id=model_id, info=info)
        elif kind == "int8":
            if device.type != "cpu":
                raise ValueError(f"drafter 'int8' needs device='cpu' (dynamic int8 kernels are CPU-only), got {device}")
            member = PoolMember(spec, kind, int8_model(model), None, tokenizer, fingerprint, model_id=model_id,
                                info=dict(derived))
        else:
            other, other_tok = load_model(spec, device=device, dtype=dtype, home=home)
            member = PoolMember(spec, "hf", other, None, other_tok, vocab_fingerprint(other_tok, other), model_id=spec,
                                info=_weights_info(spec, home))
            Pool.check_compatible(member, target_member)
        members.append(member)
    recipe = {"target": target, "device": str(device), "home": None if home is None else str(home),
              "dtype": None if dtype is None else str(dtype).replace("torch.", ""),
              "fit_source": fit_source, "fit_positions": fit_positions}
    pool = Pool(target_member, members, recipe)
    if measure_costs:
        pool.measure_costs(**(cost_kwargs or {}))
    return pool


def default_drafters(device=None) -> tuple[str, ...]:
    """The default drafter specs for ``device`` (``int8`` only on CPU)."""
    device = resolve_device(device)
    return DEFAULT_DRAFTERS if device.type == "cpu" else tuple(d for d in DEFAULT_DRAFTERS if d != "int8")


def rebuild_member(recipe: dict, name: str) -> tuple[PoolMember, PoolMember]:
    """``(member, target)`` rebuilt from a pool recipe (used by worker processes)."""
    drafters = [] if name == recipe["target"] else [name]
    pool = build_pool(recipe["target"], drafters, recipe["device"], recipe["home"], dtype=recipe["dtype"],
                      fit_source=recipe["fit_source"], fit_positions=recipe["fit_positions"])
    return pool[name], pool.target
