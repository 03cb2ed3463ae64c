"""The documentation's examples run as written: the README's tour (its sh and python blocks, in
order, in one shell, with the installed `diffattn` command: train, generate, serve, the OpenAI
client, PyTorch), every python block of docs/python.md (in order, as one script), the C++
example of the README (the same text as examples/diff_attention.cpp, which ctest builds and
runs), and examples/ddp_train.py as its docstring runs it. Each runs in a fresh directory."""

import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOKENIZERS = os.environ.get("DIFFATTN_TOKENIZER_DATA",
                            os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


def blocks(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return [(lang, body) for lang, body in FENCE.findall(f.read())]


def env():
    e = dict(os.environ)
    bindir = os.path.dirname(sys.executable)  # the environment diffattn is installed in
    e["PATH"] = bindir + os.pathsep + e.get("PATH", "")
    e["DIFFATTN_TOKENIZER_DATA"] = TOKENIZERS
    e.pop("PYTHONPATH", None)
    return e


def test_readme_tour_runs_as_written(tmp_path):
    script = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    runnable = 0
    for lang, body in blocks("README.md"):
        if lang == "sh":
            script.append(body)
            runnable += 1
        elif lang == "python":
            script.append(f"python - <<'PYTHON_SNIPPET'\n{body}PYTHON_SNIPPET")
            runnable += 1
    assert runnable >= 3, "the README's tour has lost its runnable blocks"
    p = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env(),
                       capture_output=True, text=True, errors="replace", timeout=900)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    assert '"choices"' in p.stdout and "torch.Size([1, 32, 256])" in p.stdout


def test_python_guide_runs_as_written(tmp_path):
    code = "\n".join(body for lang, body in blocks("docs/python.md") if lang == "python")
    assert code.count("\n") > 50
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"


def test_readme_cpp_example_is_the_built_example():
    cpp = [body for lang, body in blocks("README.md") if lang == "cpp"]
    assert len(cpp) == 1
    with open(os.path.join(ROOT, "examples", "diff_attention.cpp"), encoding="utf-8") as f:
        assert f.read() == cpp[0], "README's C++ block and examples/diff_attention.cpp differ"


def test_every_fence_has_a_language():
    """A block is either run (sh, python), compiled (cpp), or marked as shown only (console,
    text, json, ...): an unmarked block would silently escape these tests."""
    for path in ["README.md", "docs/python.md"]:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = f.read()
        opening = re.findall(r"^```(\w*)", text, re.M)[0::2]
        assert all(opening), f"{path}: a code block without a language"
