"""The evidence layer from Python: .npy and PNG files read back by NumPy and Pillow, the k-way
split reference against the operators and an independent PyTorch formulation, the textbook's
Exercise 2 against PyTorch autograd of the textbook's own code, the SNR demonstration's
consistency, and FORMAT.md accounting against known counts."""

import os

import numpy as np
import pytest
import torch

import diffattn

Q = np.array([[1, 0, 1, 0], [0, 2, 0, 1], [1, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1]], np.float32)
K = np.array([[0, 1, 0, 1], [1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0.5, 0.5]], np.float32)
V = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0.5] * 4], np.float32)


def test_npy_reads_back_with_numpy(tmp_path):
    rng = np.random.default_rng(0)
    for shape in [(7,), (3, 4), (2, 3, 5), (1, 1, 1, 9)]:
        a = rng.standard_normal(shape).astype(np.float32)
        path = str(tmp_path / f"a{len(shape)}.npy")
        diffattn.write_npy(path, a)
        b = np.load(path)
        assert b.dtype == np.float32 and b.shape == shape and np.array_equal(a, b)
    assert sorted(os.listdir(tmp_path)) == ["a1.npy", "a2.npy", "a3.npy", "a4.npy"], \
        "no temporary files may be left behind"
    with pytest.raises(OSError, match="missing"):
        diffattn.write_npy(str(tmp_path / "missing" / "x.npy"), a)
    with pytest.raises(ValueError, match="float32"):
        diffattn.write_npy(str(tmp_path / "x.npy"), np.zeros(3))


def test_png_reads_back_with_pillow(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, size=(13, 29, 3), dtype=np.uint8)
    path = str(tmp_path / "x.png")
    diffattn.write_png(path, rgb)
    img = Image.open(path)
    assert img.mode == "RGB" and img.size == (29, 13)
    assert np.array_equal(np.asarray(img), rgb)


def test_heatmap_png_has_the_diverging_colours(tmp_path):
    from PIL import Image

    m = np.array([[-1.0, 0.0], [0.5, 1.0]], np.float32)
    path = str(tmp_path / "h.png")
    w, h = diffattn.render_heatmap(path, m, ["a", "b"], ["c", "d"], "signed", signed=True)
    img = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3)
    assert img.shape[0] == w * h
    colours = {tuple(c) for c in img}
    assert (247, 247, 247) in colours  # zero is white
    assert (33, 102, 172) in colours   # -max is the darkest blue
    assert (178, 24, 43) in colours    # +max is the darkest red
    with pytest.raises(ValueError, match="row labels"):
        diffattn.render_heatmap(path, m, ["only one"], [], "x")


def torch_kway(q, k, v, coef, maps, causal, mode):
    """Independent formulation: q (B, Tq, maps*H, D) -> per map softmax, combine, clamp."""
    q, k, v = (torch.tensor(x, dtype=torch.float64) for x in (q, k, v))
    B, Tq, QH, D = q.shape
    H, Tk = QH // maps, k.shape[1]
    q = q.view(B, Tq, H, maps, D).permute(0, 2, 3, 1, 4)
    k = k.view(B, Tk, H, maps, D).permute(0, 2, 3, 1, 4)
    s = q @ k.transpose(-1, -2) / D ** 0.5
    if causal:
        mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
        s = s.masked_fill(~mask, float("-inf"))
    a = torch.softmax(s, dim=-1)
    w = (a * torch.tensor(coef, dtype=torch.float64).view(1, 1, maps, 1, 1)).sum(2)
    if mode == "clamp":
        w = w.clamp(min=0)
        w = w / w.sum(-1, keepdim=True).clamp(min=1e-300)
    out = w @ v.permute(0, 2, 1, 3)
    return out.permute(0, 2, 1, 3).numpy(), w.numpy()


@pytest.mark.parametrize("maps,causal,mode", [(1, False, "signed"), (2, True, "signed"),
                                              (3, False, "signed"), (3, True, "clamp"),
                                              (4, False, "clamp")])
def test_kway_matches_torch(maps, causal, mode):
    rng = np.random.default_rng(maps * 10 + causal)
    B, Tq, Tk, H, D, Dv = 2, 5, 7, 2, 4, 3
    q = rng.standard_normal((B, Tq, maps * H, D), dtype=np.float32)
    k = rng.standard_normal((B, Tk, maps * H, D), dtype=np.float32)
    v = rng.standard_normal((B, Tk, H, Dv), dtype=np.float32)
    coef = np.array([1.0, -0.5, -0.2, 0.1][:maps], np.float32)
    out, probs, weights = diffattn.kway_attention(q, k, v, coef, causal=causal, mode=mode)
    t_out, t_w = torch_kway(q, k, v, coef, maps, causal, mode)
    np.testing.assert_allclose(out, t_out, atol=2e-6)
    np.testing.assert_allclose(weights, t_w, atol=2e-6)
    assert probs.shape == (B, H, maps, Tq, Tk)


def test_kway_two_maps_is_differential_attention():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 6, 4, 8), dtype=np.float32)  # H = 2 pairs
    k = rng.standard_normal((1, 6, 4, 8), dtype=np.float32)
    v = rng.standard_normal((1, 6, 2, 5), dtype=np.float32)
    lam = 0.7
    for mode in ["signed", "clamp"]:
        want = diffattn.diff_attention(q, k, v, np.array([lam, lam], np.float32), causal=True,
                                       mode=mode, backend="reference")
        got = diffattn.kway_attention(q, k, v, np.array([1, -lam], np.float32), causal=True,
                                      mode=mode)[0]
        np.testing.assert_allclose(got, want, atol=1e-6)
    # Three coefficients mean three maps, which q's 4 sub-heads cannot hold: named in the error.
    with pytest.raises(ValueError, match=r"q has shape \(1, 6, 4, 8\).*maps = 3"):
        diffattn.kway_attention(q, k, v, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="coef"):
        diffattn.kway_attention(q, k, v, np.ones((1, 2), np.float32))


def test_exercise2_matches_torch_autograd_of_the_textbooks_code():
    def forward(lam, clamp):
        q, k, v = (torch.tensor(x, dtype=torch.float64) for x in (Q, K, V))
        a1 = torch.softmax(q[:, :2] @ k[:, :2].T / 2 ** 0.5, -1)
        a2 = torch.softmax(q[:, 2:] @ k[:, 2:].T / 2 ** 0.5, -1)
        d = a1 - lam * a2
        if clamp:  # the textbook's PyTorch implementation, line for line in effect
            d = torch.clamp(d, min=0)
            rs = d.sum(-1, keepdim=True)
            d = d / torch.where(rs == 0, torch.ones_like(rs), rs)
        return (d @ v).sum()

    e = diffattn.exercise2()
    for clamp, key in [(False, "signed"), (True, "clamp")]:
        lam = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
        loss = forward(lam, clamp)
        loss.backward()
        assert abs(e["loss_" + key] - loss.item()) < 1e-5
        assert abs(e["dlam_" + key] - lam.grad.item()) < 2e-5 * max(1, abs(lam.grad.item())), \
            (key, e["dlam_" + key], lam.grad.item())
    assert e["dlam_signed"] < 0 and e["dlam_clamp"] < 0
    assert abs(e["dlam_clamp"] - e["dlam_clamp_fd"]) < 1e-4


def test_textbook_views_match_the_textbook():
    v = diffattn.textbook_views(0.4, "clamp")
    assert v["tokens"] == ["The", "cat", "sat", "on", "mat"]
    np.testing.assert_allclose(v["diff"][1], [0.4164, 0.0575, 0.5052, 0.0, 0.0209], atol=5e-5)
    np.testing.assert_allclose(v["out_diff"][1], [0.4269, 0.0679, 0.5156, 0.0104], atol=5e-5)
    np.testing.assert_allclose(v["standard"][1], [0.4026, 0.0898, 0.2442, 0.1481, 0.1153], atol=5e-5)


def test_snr_is_seeded_and_consistent():
    a = diffattn.snr_trials(length=256, trials=6, seed=3)
    b = diffattn.snr_trials(length=256, trials=6, seed=3)
    c = diffattn.snr_trials(length=256, trials=6, seed=4)
    assert np.array_equal(a["snr_diff"], b["snr_diff"])
    assert not np.array_equal(a["snr_diff"], c["snr_diff"])
    # At lambda = 0 the differential head is map 1 alone, and the standard baseline is map 1
    # through the standard operator: the two code paths must agree.
    z = diffattn.snr_trials(length=256, trials=6, seed=3, lam=0.0)
    np.testing.assert_allclose(z["snr_diff"], z["snr_standard"], rtol=1e-5)
    np.testing.assert_allclose(z["weight_diff"], z["weight_standard"], rtol=1e-5)
    # With no noise of its own in either map, a lambda near Z2/Z1 cancels the common noise.
    r = diffattn.snr(length=256, trials=8, independent=0.0, lam=0.95)
    assert r["ratio"] > 5
    with pytest.raises(ValueError, match="length"):
        diffattn.snr(length=1)


def test_accounting_counts_known_models():
    base = dict(vocab_size=32000, d_model=4096, n_layers=32, ffn_dim=11008, head_dim=128)
    std = diffattn.account(dict(base, attention="standard", n_heads=32, n_kv_heads=32))
    assert std["params"] == 6_738_415_616  # LLaMA-7B's published count, untied head
    v1 = diffattn.account(dict(base, attention="diff_v1", n_heads=16, n_kv_heads=16))
    v2 = diffattn.account(dict(base, attention="diff_v2", n_heads=32, n_kv_heads=32))
    # V1: + lambda_q1, k1, q2, k2 (4 D) and subln (2 D) per layer; V2: + H*D*d_model queries
    # and lambda_proj (H, d_model) per layer.
    assert v1["params"] - std["params"] == 32 * 6 * 128
    assert v2["params"] - std["params"] == 32 * (32 * 128 * 4096 + 32 * 4096)
    assert v1["kv_cache_bytes_per_token"] == std["kv_cache_bytes_per_token"] == 32 * 2 * 4096 * 2
    assert v1["attn_flops_per_token"] / std["attn_flops_per_token"] == 1.5
    assert v2["attn_flops_per_token"] / std["attn_flops_per_token"] == 2.0
    names = [n for n, _, _ in diffattn.format_tensors(dict(base, attention="diff_v2", n_heads=32,
                                                           n_kv_heads=8, n_layers=1))]
    assert "layers.0.attn.lambda_proj.weight" in names and "lm_head.weight" in names
    with pytest.raises(ValueError, match="n_kv_heads"):
        diffattn.account(dict(base, attention="standard", n_heads=32, n_kv_heads=5))
    with pytest.raises(ValueError, match="colour"):
        diffattn.account(dict(base, attention="standard", n_heads=32, n_kv_heads=8, colour=1))
