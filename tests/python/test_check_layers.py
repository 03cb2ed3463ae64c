"""scripts/check_layers.py (docs/DESIGN.md, "Layers"): the repository passes, and each rule
fails on a tree that breaks it: an include up the stack, a layer's private header included by
another layer, bench/, fuzz/ or python/ reaching outside its allowed set or into a private
header that is not named with its reason, a namespace that does not follow its folder."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check_layers.py")


def run(root):
    return subprocess.run([sys.executable, SCRIPT, str(root)], capture_output=True, text=True)


def test_the_repository_passes():
    p = run(ROOT)
    assert p.returncode == 0, p.stdout


def tree(tmp_path, files):
    base = {
        "include/diffattn/base/files.h": "",
        "src/base/files.cpp": '#include "diffattn/base/files.h"\n',
        "src/base/json_util.h": "",
        "src/serve/engine.h": "",
        "src/serve/engine.cpp": '#include "serve/engine.h"\n#include "diffattn/base/files.h"\n',
        "include/diffattn/model/model.h": '#include "diffattn/base/files.h"\n',
    }
    base.update(files)
    for path, text in base.items():
        p = tmp_path / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_a_clean_tree_passes(tmp_path):
    p = run(tree(tmp_path, {
        "bench/grammar.cpp": '#include "grammar/program.h"\n',
        # namespaces that follow their folder, a root-namespace layer, nested and Highway ones
        "src/train/t.cpp": "namespace diffattn::train {\nnamespace {\n}\n}\n",
        "src/base/b.cpp": "namespace diffattn {\nnamespace hn = hwy::HWY_NAMESPACE;\n}\n",
        "src/kernels/k.cpp": "namespace diffattn::kernels {\nnamespace fused {\n}\n}\nnamespace diffattn::kernels::HWY_NAMESPACE {\n}\n",
        "src/model/m.cpp": "namespace diffattn::model {\n}\n",
        "src/infer/s.cpp": "namespace diffattn::infer::detail {\n}\n",
    }))
    assert p.returncode == 0, p.stdout


@pytest.mark.parametrize("path,text,words", [
    ("src/base/up.cpp", '#include "diffattn/model/model.h"\n', ["base includes diffattn/model/model.h"]),
    ("src/model/m.cpp", '#include "base/json_util.h"\n', ["private header of base"]),
    ("src/cli/c.cpp", '#include "serve/engine.h"\n', ["private header of serve"]),
    ("fuzz/f.cpp", '#include "serve/engine.h"\n', ["private header of serve"]),
    ("fuzz/f.cpp", '#include "cli/args.h"\n', ["allowed set of fuzz/"]),
    ("python/b.cpp", '#include "diffattn/serve/server.h"\n', ["allowed set of python/"]),
    ("bench/b.cpp", '#include "diffattn/explorer/explorer.h"\n', ["allowed set of bench/"]),
    ("src/model/m.cpp", '#include "bench/cases/attn_case.h"\n', ["model includes bench/cases"]),
    ("src/rogue/r.cpp", "", ['layer "rogue" is not in the stack']),
    ("src/train/t.cpp", "namespace diffattn::data {\n}\n", ["train opens namespace diffattn::data"]),
    ("include/diffattn/infer/s.h", "namespace diffattn {\n}\n", ["infer opens namespace diffattn "]),
    ("src/kernels/k.cpp", "namespace diffattn {\n}\n", ["kernels opens namespace diffattn "]),
    ("src/model/m.cpp", "namespace diffattn {\n}\n", ["model opens namespace diffattn "]),
    ("src/data/d.cpp", "namespace diffattn::data {\n}\nnamespace diffattn::model {\n}\n",
     ["data opens namespace diffattn::model"]),
])
def test_each_rule_fails_when_broken(tmp_path, path, text, words):
    p = run(tree(tmp_path, {path: text}))
    assert p.returncode == 1, p.stdout
    for w in words:
        assert w in p.stdout, (w, p.stdout)
