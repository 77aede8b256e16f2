"""The engines' own definitions of what ``mdboost export`` emits, read from their released sources.

Reads the pinned releases (vLLM 0.34.0 and SGLang 0.5.23 wheels, the llama-cpp-python 0.3.36
sdist with its vendored llama.cpp) without importing them (they need a GPU build), by AST for
Python and by regular expressions for llama.cpp's C++, and writes
``tests/data/engine_schemas.json``: per engine its version and, per field, flag or value, the
source file and line it was read from. ``tests/test_export_schemas.py`` checks every field and
argument the exports emit against it.

- vLLM: ``SpeculativeConfig``'s fields and the ``Literal`` values of ``SpeculativeMethod``,
  ``DraftSampleMethod``, ``RejectionSampleMethod`` (``config/speculative.py``); the keywords of
  ``LLM(...)`` (``entrypoints/llm.py``: its own and, through ``**kwargs``, ``EngineArgs``'
  fields) and ``SamplingParams``; the ``vllm serve`` flags (``engine/arg_utils.py``); the
  values ``--generation-config`` takes and the keys ``--override-generation-config`` applies
  (``config/model.py``).
- SGLang: every ``launch_server`` flag derived from the ``A[...]`` fields of
  ``srt/arg_groups/fields/*.py`` (type, choices, aliases), the builtin speculative
  algorithms (``srt/speculative/spec_info.py``) and ``SamplingParams``' fields
  (``srt/sampling/sampling_params.py``).
- llama.cpp: every option of ``common/arg.cpp`` (its names, whether ``llama-server`` takes it,
  whether it was removed) and the ``--spec-type`` names (``common/speculative.cpp``).

Usage::

    .venv/bin/python bench/engine_schemas.py --from /work/engines   # unpacked releases
    .venv/bin/python bench/engine_schemas.py                        # pip download RELEASES

``--from DIR`` expects ``DIR/vllm/x/vllm``, ``DIR/sglang/x/sglang`` and
``DIR/llama/llama_cpp_python-0.3.36``; without it the three release files of ``RELEASES`` are
downloaded from PyPI into a temporary folder (removed afterwards), checked against their
sha256, and unpacked in that layout: the wheels with ``zipfile``, the sdist with ``tarfile``.
Nothing is installed or built: the wheels come with ``--only-binary :all:`` and the platform
tags of their file names; the sdist with ``--only-binary :all: --no-binary llama-cpp-python``,
so the one step pip cannot skip for an sdist, preparing its metadata, gets its build backend
(scikit-build-core) as a wheel in pip's own temporary build environment and runs only its
metadata hook (``--no-binary :all:`` would reach that environment too and build the backend
from source). The JSON records versions and paths inside the packages only, so both ways
write the same bytes.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "engine_schemas.json"
PINS = {"vllm": "0.34.0", "sglang": "0.5.23", "llama-cpp-python": "0.3.36"}
# the release files read, as PyPI serves them: (file name, sha256)
RELEASES = {
    "vllm": ("vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
             "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2"),
    "sglang": ("sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
               "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"),
    "llama-cpp-python": ("llama_cpp_python-0.3.36.tar.gz",
                         "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"),
}
LLAMA_DIR = f"llama_cpp_python-{PINS['llama-cpp-python']}"


# --- Python sources, by AST --------------------------------------------------------------------

def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def class_fields(tree: ast.Module, name: str) -> dict:
    """``{field: {"line", "type", "default"?}}`` of the annotated assignments of class ``name``."""
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    fields = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            entry = {"line": node.lineno, "type": ast.unparse(node.annotation)}
            try:
                entry["default"] = ast.literal_eval(node.value) if node.value is not None else None
            except ValueError:
                pass  # a call (field(...), Field(...)): no literal default
            fields[node.target.id] = entry
    return fields


def literal_aliases(tree: ast.Module) -> dict:
    """``{alias: {"line", "values"}}`` of the module's ``X = Literal[...]``, nested aliases resolved."""
    raw = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Subscript) and ast.unparse(node.value.value) == "Literal"):
            items = node.value.slice.elts if isinstance(node.value.slice, ast.Tuple) else [node.value.slice]
            raw[node.targets[0].id] = (node.lineno, items)

    def values(name: str) -> list:
        out = []
        for item in raw[name][1]:
            out += values(item.id) if isinstance(item, ast.Name) else [item.value]
        return out

    return {name: {"line": line, "values": values(name)} for name, (line, _) in raw.items()}


def function_params(tree: ast.Module, cls: str, func: str) -> dict:
    """``{param: line}`` of ``cls.func``'s named parameters (``self`` and ``**kwargs`` left out)."""
    owner = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in owner.body if isinstance(n, ast.FunctionDef) and n.name == func)
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return {a.arg: a.lineno for a in args if a.arg != "self"}


def list_in_function(tree: ast.Module, func: str, name: str) -> dict:
    """The literal list assigned to ``name`` inside function ``func``, with its line."""
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == func)
    node = next(n for n in ast.walk(fn) if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == name)
    return {"line": node.lineno, "values": ast.literal_eval(node.value)}


def argparse_flags(text: str) -> dict:
    """``{flag: line}`` of every ``add_argument("--flag", ...)`` (its first name, and aliases)."""
    flags = {}
    for match in re.finditer(r"add_argument\(\s*((?:\"-[^\"]+\"\s*,\s*)+)", text):
        line = text.count("\n", 0, match.start()) + 1
        for flag in re.findall(r"\"(-[^\"]+)\"", match.group(1)):
            flags.setdefault(flag, line)
    return flags


def vllm_schema(pkg: Path) -> dict:
    """vLLM's definitions; ``pkg``: the ``vllm`` package folder."""
    version = re.search(r"__version__ = version = '([^']+)'", (pkg / "_version.py").read_text()).group(1)
    spec = _tree(pkg / "config/speculative.py")
    engine_args = pkg / "engine/arg_utils.py"
    model = _tree(pkg / "config/model.py")
    gen_line = class_fields(model, "ModelConfig")["generation_config"]["line"]
    return {
        "version": version,
        "speculative_config": {"file": "vllm/config/speculative.py",
                               "fields": class_fields(spec, "SpeculativeConfig"),
                               "literals": literal_aliases(spec)},
        "sampling_params": {"file": "vllm/sampling_params.py",
                            "fields": class_fields(_tree(pkg / "sampling_params.py"), "SamplingParams")},
        "llm": {"file": "vllm/entrypoints/llm.py",
                "params": function_params(_tree(pkg / "entrypoints/llm.py"), "LLM", "__init__")},
        "engine_args": {"file": "vllm/engine/arg_utils.py",
                        "fields": class_fields(_tree(engine_args), "EngineArgs")},
        "serve_flags": {"file": "vllm/engine/arg_utils.py", "flags": argparse_flags(engine_args.read_text())},
        # ModelConfig.generation_config: "auto", "vllm" or a folder (its docstring, and
        # get_diff_sampling_param: config = {} if src == "vllm")
        "generation_config": {"file": "vllm/config/model.py", "line": gen_line, "values": ["auto", "vllm"]},
        "override_generation_config": {"file": "vllm/config/model.py",
                                       **list_in_function(model, "get_diff_sampling_param", "available_params")},
    }


def _annotated(node: ast.AnnAssign) -> tuple[ast.expr, ast.expr] | None:
    """``(type, metadata)`` of an ``A[type, "help" | Arg(...)]`` annotation, else None."""
    ann = node.annotation
    if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) == "A" and isinstance(ann.slice, ast.Tuple)):
        return None
    return ann.slice.elts[0], ann.slice.elts[1]


def _literal_values(kind: ast.expr) -> list | None:
    """The values of the ``Literal[...]`` inside a type (``Optional[Literal[...]]`` too), else None."""
    for node in ast.walk(kind):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "Literal":
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [ast.literal_eval(item) for item in items]
    return None


def _arg_keywords(meta: ast.expr) -> dict:
    if not (isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Arg"):
        return {}
    out = {}
    for kw in meta.keywords:
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            out[kw.arg] = ast.unparse(kw.value)  # a name (LOAD_FORMAT_CHOICES), an action class
    return out


def sglang_schema(pkg: Path, dist_info: Path) -> dict:
    """SGLang's ``launch_server`` flags; ``pkg``: the ``sglang`` package folder."""
    version = re.search(r"^Version: (\S+)$", (dist_info / "METADATA").read_text(), re.M).group(1)
    flags = {}
    for path in sorted((pkg / "srt/arg_groups/fields").glob("*.py")):
        for node in ast.walk(_tree(path)):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            parsed = _annotated(node)
            if parsed is None:
                continue
            kind, meta = parsed
            arg = _arg_keywords(meta)
            if arg.get("no_cli"):
                continue
            name = node.target.id
            choices = arg.get("choices")
            if choices is None:
                choices = _literal_values(kind)
            entry = {"field": name, "type": ast.unparse(kind), "choices": choices, "file": f"sglang/{path.relative_to(pkg)}",
                     "line": node.lineno, "action": arg.get("action")}
            try:
                entry["default"] = ast.literal_eval(node.value) if node.value is not None else None
            except ValueError:
                pass
            for flag in [arg.get("cli_name") or "--" + name.replace("_", "-"), *(arg.get("aliases") or [])]:
                flags[flag] = entry
    spec_info = _tree(pkg / "srt/speculative/spec_info.py")
    enum = next(n for n in ast.walk(spec_info) if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm")
    members = {t.id: node.lineno for node in enum.body if isinstance(node, ast.Assign) for t in node.targets}
    sampling = class_fields(_tree(pkg / "srt/sampling/sampling_params.py"), "SamplingParams")
    return {"version": version, "launch_server": {"module": "sglang.launch_server", "flags": flags},
            "sampling_params": {"file": "sglang/srt/sampling/sampling_params.py", "fields": sampling},
            "speculative_algorithms": {"file": "sglang/srt/speculative/spec_info.py",
                                       "values": {k: v for k, v in members.items() if k != "NONE"}}}


# --- llama.cpp, by regular expressions ------------------------------------------------------------

_OPTION = re.compile(r"add_opt\(common_arg\(\s*\{([^}]*)\}")


def llamacpp_schema(sdist: Path) -> dict:
    """llama.cpp's options (``common/arg.cpp``) as vendored by llama-cpp-python ``sdist``."""
    version = re.search(r"^Version: (\S+)$", (sdist / "PKG-INFO").read_text(), re.M).group(1)
    src = sdist / "vendor/llama.cpp"
    text = (src / "common/arg.cpp").read_text()
    starts = [m for m in _OPTION.finditer(text)]
    options = {}
    for i, match in enumerate(starts):
        body = text[match.start(): starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        names = re.findall(r"\"(-[^\"]+)\"", match.group(1))
        examples = re.search(r"set_examples\(\{([^}]*)\}\)", body)
        excludes = re.search(r"set_excludes\(\{([^}]*)\}\)", body)
        # every tool takes LLAMA_EXAMPLE_COMMON's options (common/arg.cpp's parser: in_example(ex) or
        # in_example(COMMON), and not is_exclude(ex)); no set_examples means COMMON (common/arg.h)
        shown = examples.group(1) if examples else "LLAMA_EXAMPLE_COMMON"
        entry = {"names": names, "line": text.count("\n", 0, match.start(1)) + 1,
                 "removed": "arg_removed(" in body,
                 "server": (("LLAMA_EXAMPLE_SERVER" in shown or "LLAMA_EXAMPLE_COMMON" in shown)
                            and not (excludes and "LLAMA_EXAMPLE_SERVER" in excludes.group(1)))}
        for name in names:
            options.setdefault(name, entry)
    spec = (src / "common/speculative.cpp").read_text()
    table = re.search(r"\{\s*\{\"none\",.*?\};", spec, re.S)
    types = {m.group(1): spec.count("\n", 0, table.start() + m.start()) + 1
             for m in re.finditer(r"\{\"([a-z0-9-]+)\",\s*COMMON_SPECULATIVE_TYPE_", table.group(0))}
    return {"version": version, "llama_server": {"file": "vendor/llama.cpp/common/arg.cpp", "options": options},
            "spec_types": {"file": "vendor/llama.cpp/common/speculative.cpp", "values": types}}


# --- the releases ---------------------------------------------------------------------------------

def pip_download_args(name: str) -> list[str]:
    """The ``pip download`` arguments that fetch ``RELEASES[name]`` and build nothing.

    Every file is binary-only (``--only-binary :all:``, which pip also passes to the environment
    it prepares an sdist's metadata in); a wheel is chosen by its file name's platform and ABI
    tags, whatever this machine is; the sdist is the one source-only package.
    """
    filename = RELEASES[name][0]
    args = ["download", "--no-deps", "--no-cache-dir", "--only-binary", ":all:"]
    if filename.endswith(".tar.gz"):
        return [*args, "--no-binary", name, f"{name}=={PINS[name]}"]
    _name, _version, _python, abi, platform = filename.removesuffix(".whl").split("-")
    return [*args, "--platform", platform, "--implementation", "cp", "--abi", abi, "--python-version", "3.11",
            f"{name}=={PINS[name]}"]


def download(scratch: Path) -> Path:
    """Download ``RELEASES`` into ``scratch``, check their sha256, and unpack them in the
    ``--from`` layout."""
    files = scratch / "dl"
    for name, (filename, sha256) in RELEASES.items():
        subprocess.run([sys.executable, "-m", "pip", *pip_download_args(name), "--dest", str(files)], check=True)
        digest = hashlib.sha256((files / filename).read_bytes()).hexdigest()
        if digest != sha256:
            raise SystemExit(f"{filename}: sha256 {digest}, pinned {sha256}")
    for name in ("vllm", "sglang"):
        with zipfile.ZipFile(files / RELEASES[name][0]) as zf:
            zf.extractall(scratch / name / "x")
    with tarfile.open(files / RELEASES["llama-cpp-python"][0]) as tf:
        tf.extractall(scratch / "llama", filter="data")
    return scratch


def schemas(root: Path) -> dict:
    """Every engine's definitions, read from ``root`` (the ``--from`` layout)."""
    sglang_x = root / "sglang/x"
    out = {"vllm": vllm_schema(root / "vllm/x/vllm"),
           "sglang": sglang_schema(sglang_x / "sglang", next(sglang_x.glob("sglang-*.dist-info"))),
           "llamacpp": llamacpp_schema(root / "llama" / LLAMA_DIR)}
    for engine, pin in (("vllm", "vllm"), ("sglang", "sglang"), ("llamacpp", "llama-cpp-python")):
        if out[engine]["version"] != PINS[pin]:
            raise SystemExit(f"{engine}: read version {out[engine]['version']}, pinned {PINS[pin]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="folder holding the unpacked releases (default: pip download them)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.source is not None:
        result = schemas(args.source)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = schemas(download(Path(tmp)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    counts = {"vllm": len(result["vllm"]["speculative_config"]["fields"]),
              "sglang": len(result["sglang"]["launch_server"]["flags"]),
              "llamacpp": len(result["llamacpp"]["llama_server"]["options"])}
    print(f"wrote {args.out}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
