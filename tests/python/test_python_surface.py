"""The Python surface as a new user meets it (issue 30): the project's own config.json goes
into diffattn.account as it is, a loaded model's config is a dict, the version is the
project's, and every public name of diffattn and diffattn.torch has a docstring."""

import json
import re
import os

import diffattn
import diffattn.torch as dt
import torch_model as tm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFG = {"format": "diffattn/1", "attention": "diff_v2", "vocab_size": 64, "d_model": 32,
       "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 8, "ffn_dim": 48,
       "max_seq_len": 32, "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": True}


def test_account_takes_the_projects_config_json(tmp_path):
    tm.save_model_dir(str(tmp_path), CFG, tm.random_weights(CFG, 1))
    with open(tmp_path / "config.json") as f:
        from_file = diffattn.account(json.load(f), context=128)
    m = diffattn.load_model(str(tmp_path))
    assert isinstance(m.config, dict) and m.config["attention"] == "diff_v2"
    assert m.config["norm_eps"] == 1e-5  # written as the float it is, not its double widening
    assert diffattn.account(m.config, context=128) == from_file
    assert from_file["params"] == m.num_params
    arch = {k: CFG[k] for k in ("attention", "vocab_size", "d_model", "n_layers", "n_heads",
                                "n_kv_heads", "head_dim", "ffn_dim", "tie_embeddings")}
    assert diffattn.account(arch, context=128)["params"] == m.num_params


def test_version_is_the_projects():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        v = re.search(r"project\(diffattn[^)]*VERSION\s+([0-9.]+)", f.read()).group(1)
    assert diffattn.__version__ == v


def test_public_names_are_documented():
    for mod in (diffattn, dt):
        names = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
        for n in names:
            obj = getattr(mod, n)
            if callable(obj):
                assert (obj.__doc__ or "").strip(), f"{mod.__name__}.{n} has no docstring"
