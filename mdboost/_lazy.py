"""Public names of a package imported on first use (PEP 562), so that importing the package stays cheap."""

from __future__ import annotations

import sys
from importlib import import_module


def lazy_exports(package: str, exports: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package`` whose public name ``n`` lives in the module
    ``exports[n]`` (absolute, or relative to ``package`` with a leading dot).

    The first access imports that module and keeps the value in the package; a module exported
    under its own name (``mdboost.divergences``) is the module itself unless it defines that name.
    """

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = import_module(exports[name], package)
        value = getattr(module, name) if hasattr(module, name) else module
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
