"""diffattn.torch.load / save: a model directory as an nn.Module whose parameter names are the
checkpoint's tensor names and whose logits, loss and gradients match the C++ model's; both are
checked against the independent float64 implementation (torch_model.py) with the tolerance
test_model_torch.py uses (8x the float32 PyTorch error plus a floor of 1e-6 of the scale,
2.5e-6 for V1's lambda vectors: grad_floor)."""

import json

import numpy as np
import pytest
import torch

import diffattn
import diffattn.torch as dt
import torch_model as tm
from test_model_torch import config, grad_floor, torch_references, within


@pytest.mark.parametrize("kind,tie,li", [("diff_v1", False, None), ("diff_v1", True, 0.5),
                                         ("diff_v2", False, None), ("standard", True, None)])
def test_load_matches_cpp_model_and_reference(tmp_path, kind, tie, li):
    cfg = config(kind, tie, li)
    weights = tm.random_weights(cfg, seed=11)
    tm.save_model_dir(str(tmp_path / "m"), cfg, weights)
    cpp = diffattn.load_model(str(tmp_path / "m"))
    module = dt.load(tmp_path / "m")
    assert isinstance(module, torch.nn.Module)
    assert sorted(n for n, _ in module.named_parameters()) == sorted(weights)
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, cfg["vocab_size"], size=(2, 17), dtype=np.int64)
    targets = rng.integers(0, cfg["vocab_size"], size=(2, 17), dtype=np.int64)
    (l64, loss64, g64), (l32, loss32, g32) = torch_references(cfg, weights, tokens, targets)

    logits = module(torch.from_numpy(tokens))
    assert logits.shape == (2, 17, cfg["vocab_size"]) and logits.dtype == torch.float32
    within(logits.detach().numpy(), l64, l32, "diffattn.torch logits")
    within(cpp.forward(tokens), l64, l32, "C++ logits")
    loss = module.loss(torch.from_numpy(tokens), torch.from_numpy(targets))
    within([loss.item()], [loss64], [loss32], "loss")
    within([cpp.loss(tokens, targets)], [loss64], [loss32], "C++ loss")
    loss.backward()
    cpp_grads = cpp.gradients(tokens, targets)
    for name, p in module.named_parameters():
        within(p.grad.numpy(), g64[name], g32[name], "gradient of " + name, floor=grad_floor(name))
        within(cpp_grads[name], g64[name], g32[name], "C++ gradient of " + name,
               floor=grad_floor(name))

    # save writes what the C++ loader reads back bit for bit
    dt.save(module, tmp_path / "saved")
    back = diffattn.load_model(str(tmp_path / "saved"))
    assert back.config == cpp.config and isinstance(cpp.config, dict)
    for name, arr in back.parameters().items():
        np.testing.assert_array_equal(arr, weights[name], err_msg=name)
    np.testing.assert_array_equal(back.forward(tokens), cpp.forward(tokens))


def test_load_and_forward_errors(tmp_path):
    with pytest.raises(OSError):
        dt.load(tmp_path / "missing")
    cfg = config("diff_v1")
    tm.save_model_dir(str(tmp_path / "m"), cfg, tm.random_weights(cfg, seed=1))
    module = dt.load(tmp_path / "m")
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 61\)"):
        module(torch.tensor([[0, 61]]))
    with pytest.raises(ValueError, match="int64 \\(B, T\\)"):
        module(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="more than max_seq_len 32"):
        module(torch.zeros(1, 33, dtype=torch.int64))
    with pytest.raises(TypeError, match="save: module must be a DiffTransformerLM"):
        dt.save(torch.nn.Linear(2, 2), tmp_path / "x")
