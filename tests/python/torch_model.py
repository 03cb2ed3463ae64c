"""An independent PyTorch implementation of the diffattn/1 language model, written from
docs/FORMAT.md (and the paper's Eqs. 1-3 for DIFF V1), not from diffattn's C++: dense
attention maps with an explicit causal mask, autograd for every gradient.

Also a small pure-Python safetensors reader and writer (Debian has no python3-safetensors).
"""

import json
import math
import os
import struct

import numpy as np
import torch

import hf_reference
import model_helpers

# ---------------------------------------------------------------- safetensors

_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (None, 2)}


def write_safetensors(path, tensors, metadata=None, dtype="F32"):
    """tensors: {name: array-like}; written in sorted name order as F32 (or F16/BF16)."""
    entries = []
    for name in sorted(tensors):
        a = np.ascontiguousarray(np.asarray(tensors[name], dtype=np.float32))
        if dtype == "F32":
            raw = a.astype("<f4").tobytes()
        elif dtype == "F16":
            raw = a.astype("<f2").tobytes()
        elif dtype == "BF16":
            raw = (a.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()  # truncation
        else:
            raise ValueError(dtype)
        entries.append((name, dtype, a.shape, raw))
    hf_reference.write_safetensors_raw(path, entries, metadata)


def read_safetensors(path):
    """Returns ({name: float32 numpy array}, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n :]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        raw = body[b:end]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(e["dtype"])
        out[name] = a.reshape(e["shape"]).copy()
    return out, meta


# ---------------------------------------------------------------- the model


def lambda_init_of(cfg, layer):
    if cfg.get("lambda_init") is not None:
        return cfg["lambda_init"]
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def tensor_shapes(cfg):
    """{name: shape} of docs/FORMAT.md's tensors for a config dict (model_helpers.tensor_shapes)."""
    return model_helpers.tensor_shapes(cfg)


def random_weights(cfg, seed, std=0.1, lam_std=0.1, gain_std=0.1, bias_std=None):
    """Seeded random weights for every tensor of cfg: norms and V1's subln 1 + gain_std N(0, 1)
    (away from 1, so a dropped weight shows), V1's lambda vectors lam_std N(0, 1), biases
    bias_std (default std) N(0, 1), the matrices std N(0, 1)."""
    g = np.random.default_rng(seed)
    w = {}
    for name, shape in tensor_shapes(cfg).items():
        if name.endswith("norm.weight") or name.endswith("subln.weight"):
            s = gain_std
            w[name] = (1.0 + s * g.standard_normal(shape)).astype(np.float32)
            continue
        if ".attn.lambda_" in name and "lambda_proj" not in name:
            s = lam_std
        elif name.endswith(".bias") and bias_std is not None:
            s = bias_std
        else:
            s = std
        w[name] = (s * g.standard_normal(shape)).astype(np.float32)
    return w


def save_model_dir(path, cfg, weights, dtype="F32"):
    """A model directory: config.json and model.safetensors. Returns the path as a str."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    write_safetensors(os.path.join(path, "model.safetensors"), weights, dtype=dtype)
    return str(path)


def _rmsnorm(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(u, theta):
    """u (B, T, n, D): pairs (2j, 2j+1) rotate by t * theta^(-2j/D)."""
    B, T, n, D = u.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    freq = theta ** (-2.0 * j / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]  # (T, D/2)
    c = torch.cos(ang).to(u.dtype)[None, :, None, :]
    s = torch.sin(ang).to(u.dtype)[None, :, None, :]
    u0, u1 = u[..., 0::2], u[..., 1::2]
    out = torch.stack((u0 * c - u1 * s, u0 * s + u1 * c), dim=-1)
    return out.reshape(B, T, n, D)


def _softmax_causal(q, k, scale):
    """q (B, n, T, D), k (B, n, T, D) -> (B, n, T, T) causal softmax."""
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) * scale
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1)


def _expand(x, rep):
    """(B, T, G, D) -> (B, G*rep, T, D), group g serving heads g*rep .. g*rep+rep-1."""
    return x.permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)


def attention(cfg, layer, P, x, kv=None):
    """kv: None, or a function applied to the keys (after RoPE) and the values, as a KV cache
    that stores them in 16 bits rounds them (attention reads the stored values)."""
    kind = cfg["attention"]
    kv = kv or (lambda u: u)
    H, G, D = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    B, T, C = x.shape
    p = f"layers.{layer}.attn."
    q = x @ P[p + "q_proj.weight"].T
    k = x @ P[p + "k_proj.weight"].T
    v = x @ P[p + "v_proj.weight"].T
    scale = 1.0 / math.sqrt(D)
    theta = cfg["rope_theta"]
    rep = H // G
    if kind == "standard":
        q = _rope(q.view(B, T, H, D), theta)
        k = kv(_rope(k.view(B, T, G, D), theta))
        a = _softmax_causal(q.permute(0, 2, 1, 3), _expand(k, rep), scale)
        o = a @ _expand(kv(v.view(B, T, G, D)), rep)  # (B, H, T, D)
        o = o.permute(0, 2, 1, 3).reshape(B, T, H * D)
        return o @ P[p + "out_proj.weight"].T
    q = _rope(q.view(B, T, 2 * H, D), theta)
    q1 = q[:, :, 0::2].permute(0, 2, 1, 3)  # sub-head 2h: map 1 of pair h
    q2 = q[:, :, 1::2].permute(0, 2, 1, 3)
    if kind == "diff_v1":
        k = kv(_rope(k.view(B, T, 2 * G, D), theta))
        k1, k2 = _expand(k[:, :, 0::2], rep), _expand(k[:, :, 1::2], rep)
        vv = _expand(kv(v.view(B, T, G, 2 * D)), rep)
        li = lambda_init_of(cfg, layer)
        # Eq. 2
        lam = (torch.exp(torch.dot(P[p + "lambda_q1"], P[p + "lambda_k1"]))
               - torch.exp(torch.dot(P[p + "lambda_q2"], P[p + "lambda_k2"])) + li)
        o = (_softmax_causal(q1, k1, scale) - lam * _softmax_causal(q2, k2, scale)) @ vv
        o = (1.0 - li) * _rmsnorm(o, P[p + "subln.weight"], cfg["norm_eps"])  # Eq. 3
        o = o.permute(0, 2, 1, 3).reshape(B, T, H * 2 * D)
    else:
        k = _expand(kv(_rope(k.view(B, T, G, D), theta)), rep)
        vv = _expand(kv(v.view(B, T, G, D)), rep)
        lam = torch.sigmoid(x @ P[p + "lambda_proj.weight"].T)  # (B, T, H)
        lam = lam.permute(0, 2, 1).unsqueeze(-1)  # (B, H, T, 1)
        o = (_softmax_causal(q1, k, scale) - lam * _softmax_causal(q2, k, scale)) @ vv
        o = o.permute(0, 2, 1, 3).reshape(B, T, H * D)
    return o @ P[p + "out_proj.weight"].T


def forward(cfg, P, tokens, kv=None):
    """tokens (B, T) int64 tensor -> logits (B, T, V). P: {name: tensor}. kv: see attention."""
    eps = cfg["norm_eps"]
    x = P["embed_tokens.weight"][tokens]
    for l in range(cfg["n_layers"]):
        p = f"layers.{l}."
        x = x + attention(cfg, l, P, _rmsnorm(x, P[p + "attn_norm.weight"], eps), kv)
        h = _rmsnorm(x, P[p + "ffn_norm.weight"], eps)
        f = torch.nn.functional.silu(h @ P[p + "ffn.gate_proj.weight"].T) * (h @ P[p + "ffn.up_proj.weight"].T)
        x = x + f @ P[p + "ffn.down_proj.weight"].T
    head = P["embed_tokens.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    return _rmsnorm(x, P["norm.weight"], eps) @ head.T


def loss(cfg, P, tokens, targets):
    logits = forward(cfg, P, tokens)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def params_from(weights, dtype=torch.float64, grad=False):
    return {k: torch.tensor(v, dtype=dtype, requires_grad=grad) for k, v in weights.items()}
