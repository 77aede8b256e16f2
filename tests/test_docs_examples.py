"""Every ```python example of the docs pages runs as pasted, each as a script of its own (a fresh
interpreter in an empty folder, ``__name__ == "__main__"``): what the docs site shows is what
runs. (README's are run by ``tests/test_readme.py``, the API reference's docstring examples as
doctests.) Examples on the bundled SmolLM2 model, llama.cpp or a Dask cluster take minutes:
they are slow tests; llama.cpp's skip with the reason where llama-cpp-python is absent.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mdboost.models.gguf_drafters import llama_cpp_available

DOCS = Path(__file__).resolve().parents[1] / "docs"
SLOW = ("smollm2-135m", "dask_client", "llamacpp")  # what makes an example take minutes


def _examples() -> list:
    out = []
    for page in sorted(DOCS.glob("*.md")):
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)):
            marks = [pytest.mark.slow] if any(word in block for word in SLOW) else []
            if "llamacpp" in block and not llama_cpp_available():
                marks.append(pytest.mark.skip(reason="llama-cpp-python is not installed (pip install 'mdboost[llamacpp]')"))
            out.append(pytest.param(page.name, block, id=f"{page.stem}-{i}", marks=marks))
    return out


EXAMPLES = _examples()


def test_the_docs_have_examples():
    assert len(EXAMPLES) >= 7


@pytest.mark.parametrize("page, block", EXAMPLES)
def test_a_docs_example_runs_as_pasted(page, block, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(block)
    env = {**os.environ, "PYTHONPATH": str(DOCS.parent), "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, f"docs/{page}:\n{block}\n{done.stderr[-3000:]}"
