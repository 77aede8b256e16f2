"""A strict YAML loader for nested dataclasses: the schema of a pipeline config is its dataclass.

:func:`from_dict` builds a dataclass from a mapping, strictly: an unknown key raises
``ValueError`` naming the key and its dotted path (``unknown key 'budgts' at 'md'``, with the
allowed keys), and every value is type-checked against the dataclass annotation (``int``,
``float``, ``str``, ``bool``, ``Literal``, ``Optional``, ``list``/``tuple``, ``dict[str, X]`` and
nested dataclasses); a ``ValueError`` raised by a section's own checks gets the section's path
(checks a top-level config runs later, once every section is built, name theirs: :func:`at`).
:func:`load_yaml` reads a file through it, after the command line's dotted overrides
(:func:`apply_overrides`: ``md.budgets=[0,0.1]``, the value parsed as YAML), so an override is
checked exactly as the same key in the file; :func:`to_dict` turns a config back into plain data.
Nothing here knows mdboost: the schemas live in :mod:`pipelines.config`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config error that already names its dotted path (``config error at 'md': ...``): passed up
    unchanged by :func:`from_dict` (raised by :func:`at`)."""


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _fail(path: str, msg: str):
    raise ValueError(f"config error at '{path or '<root>'}': {msg}")


def _convert(tp, value, path: str):
    """Check ``value`` against the annotation ``tp`` and return it converted (lists, dataclasses)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, _path=path)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors, here = [], f"config error at '{path or '<root>'}': "
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, path)
            except ValueError as err:
                errors.append(str(err).removeprefix(here))  # the path is said once, by the message below
        _fail(path, f"expected {_type_name(tp)}, got {value!r} ({'; '.join(errors)})")
    if origin is Literal:
        if value not in args:
            _fail(path, f"expected one of {list(args)}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            _fail(path, f"expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_convert(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            _fail(path, f"expected a mapping, got {value!r}")
        key_tp, val_tp = args if args else (Any, Any)
        return {_convert(key_tp, k, f"{path}.{k}"): _convert(val_tp, v, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            _fail(path, f"expected a boolean (true/false), got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(path, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            _fail(path, f"expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported annotation {tp!r} at '{path}'")


def from_dict(cls: type[T], data: dict | None, *, _path: str = "") -> T:
    """Build the dataclass ``cls`` from a mapping, strictly.

    Parameters
    ----------
    cls : dataclass type
        The (possibly nested) configuration dataclass.
    data : dict or None
        Keys are field names; missing keys keep their defaults; ``None`` means all defaults.

    Raises
    ------
    ValueError
        On an unknown key (the message names the key, its dotted path and the allowed keys),
        a value of the wrong type, or a ``__post_init__`` check that fails.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        _fail(_path, f"expected a mapping for {cls.__name__}, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in data if k not in names]
    if unknown:
        where = _path or "<root>"
        raise ValueError(
            f"config error: unknown key {unknown[0]!r} at '{where}' "
            f"(allowed keys: {', '.join(names)})"
        )
    kwargs = {}
    for key, value in data.items():
        kwargs[key] = _convert(hints[key], value, f"{_path}.{key}" if _path else key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise  # a check the config ran at a section's path (at): it names that path already
    except ValueError as err:
        raise ValueError(f"config error at '{_path or '<root>'}': {err}") from None


def parse_override(override: str) -> tuple[list[str], Any]:
    """``"md.budgets=[0, 0.1]"`` -> ``(["md", "budgets"], [0, 0.1])``: a dotted key path and a
    value parsed as YAML (``out/x`` is a string, ``null`` None, ``1e-3`` a string as in a file:
    write ``1.0e-3``).

    Examples
    --------
    >>> parse_override("md.budgets=[0, 0.1]")
    (['md', 'budgets'], [0, 0.1])
    >>> parse_override("output_dir=out/x")
    (['output_dir'], 'out/x')

    Raises
    ------
    ValueError
        Naming the override when it has no ``=``, an empty key part, or a value that is not YAML.
    """
    if not isinstance(override, str):
        raise TypeError(f"override must be a string 'key.path=value', got {override!r}")
    key, sep, text = override.partition("=")
    keys = key.strip().split(".")
    if not sep or not all(k.strip() for k in keys):
        raise ValueError(f"--set expects key.path=value (e.g. md.budgets=[0,0.1]), got {override!r}")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"--set {override!r}: the value is not valid YAML: {problem}") from None
    return [k.strip() for k in keys], value


def apply_overrides(data: dict | None, overrides=()) -> dict:
    """A copy of the mapping ``data`` with each ``key.path=value`` of ``overrides`` set in turn
    (later ones win; missing sections are created). Unknown keys are left for :func:`from_dict`
    to name, so an override is checked exactly as the same key written in the file.

    Examples
    --------
    >>> apply_overrides({"md": {"budgets": [0.0]}, "name": "a"}, ["md.budgets=[0, 0.1]", "pool.target=tiny"])
    {'md': {'budgets': [0, 0.1]}, 'name': 'a', 'pool': {'target': 'tiny'}}

    Raises
    ------
    ValueError
        Naming the override when its path runs through a value that is not a mapping.
    """
    overrides = list(overrides)
    out = copy.deepcopy(data) if data is not None else {}
    if not overrides:
        return out
    if not isinstance(out, dict):
        _fail("", f"expected a mapping at the top of the config, got {out!r}")
    for override in overrides:
        keys, value = parse_override(override)
        node = out
        for depth, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                where = ".".join(keys[:depth + 1])
                raise ValueError(f"--set {override!r}: '{where}' holds {child!r}, not a section")
            node = child
        node[keys[-1]] = value
    return out


def load_yaml(path: str | Path, cls: type[T], overrides=()) -> T:
    """Read a YAML file, apply the dotted ``overrides`` (:func:`apply_overrides`, the CLI's
    ``--set``) and build ``cls`` with :func:`from_dict` (a missing file or a YAML syntax
    error: ``ValueError`` naming the file, and the line and column of the error)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config must be an existing YAML file, got {str(path)!r}")
    try:
        with path.open() as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as err:  # one line: where, and what the parser says
        mark = getattr(err, "problem_mark", None)
        where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"config {str(path)!r} is not valid YAML{where}: {problem}") from None
    return from_dict(cls, apply_overrides(data, overrides))


def to_dict(config) -> dict:
    """The config as plain dicts/lists (tuples become lists), ready for YAML/JSON."""
    def plain(v):
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(config))


@contextlib.contextmanager
def at(path: str):
    """A section's check run later than its ``__post_init__`` (by the top-level config, after the
    cheap checks of every section) reports as the loader reports the section's own checks: a
    ``ValueError`` raised inside becomes :class:`ConfigError` ``config error at '<path>': ...``.

    Examples
    --------
    >>> with at("pool"):
    ...     check(False, "drafters[0]", "early_exit:99")
    Traceback (most recent call last):
    ...
    pipelines.loader.ConfigError: config error at 'pool': invalid drafters[0]: 'early_exit:99'
    """
    try:
        yield
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"config error at '{path or '<root>'}': {err}") from None


def check(cond: bool, name: str, value) -> None:
    """A section's value check: ``ValueError('invalid <name>: <value>')`` unless ``cond``."""
    if not cond:
        raise ValueError(f"invalid {name}: {value!r}")
