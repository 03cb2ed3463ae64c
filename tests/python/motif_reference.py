"""An independent float64 PyTorch reference for Motif Technologies' Motif-2 checkpoints
(MotifForCausalLM): Motif-2.6B (differential attention in every layer, adjacent head pairs) and
Motif-2-12.7B (grouped differential attention: several signal heads share one noise head).

Written from docs/models/motif2.md, which records what the published modeling code does and where
each fact comes from; no code is shared with diffattn's engine. Every attention map is
materialised, in the symbols of arXiv:2410.05258 (DIFF Transformer) and arXiv:2510.06949 (GDA):

    A1 = softmax(Q1 K1^T / sqrt(d))          the signal map of one signal head
    A2 = softmax(Q2 K2^T / sqrt(d))          the noise map of its group's noise head
    O  = (A1 - lambda A2) [V1 | V2]          (T, 2d)
    O  = (1 - lambda_init) * RMSNorm_2d(O)   learnable weight, eps = attn_rms_norm_eps
    lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init
    lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)),   l the 0-based layer index (Motif's convention)

Head layout (both models are one rule; Motif-2.6B is the group size 2 case):
    G noise heads (num_noise_heads, H/2 when the key is absent), group size S = H / G;
    query heads g*S .. g*S+S-2 are group g's signal heads, query head g*S+S-1 its noise head;
    key/value heads form adjacent pairs j = (2j, 2j+1): K1 = k_2j, K2 = k_2j+1, V1 = v_2j, V2 = v_2j+1;
    group g reads pair j = g // (G / P), P = Hkv / 2 pairs (GQA over groups);
    the output concatenates the H - G signal heads (2d each) in query order: o_proj (C, 2 (H-G) d).

Also: seeded random weights with meaningful scales, a config builder for scaled-down configs that
keep every structural feature, greedy decoding by full recomputation, and reading a checkpoint
directory (single or sharded safetensors, F32/BF16/F16) with the safetensors library.
"""

import json
import math
import os

import numpy as np
import torch

import hf_reference as hr  # only the tolerance rules and BF16 rounding, shared by every HF reference

# ------------------------------------------------------------------ config

# The published shapes as far as the sources show them (docs/models/motif2.md, "config.json"):
# values marked there as inferred are inferred, not read from a published config.json.
PUBLISHED = {
    "2.6b": dict(vocab_size=219520, hidden_size=2048, intermediate_size=8192, num_hidden_layers=32,
                 num_attention_heads=16, num_key_value_heads=16, head_dim=None, num_noise_heads=None,
                 max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=True),
    "12.7b": dict(vocab_size=219520, hidden_size=4096, intermediate_size=16384, num_hidden_layers=40,
                  num_attention_heads=40, num_key_value_heads=16, head_dim=128, num_noise_heads=8,
                  max_position_embeddings=65536, rope_theta=1000000.0, tie_word_embeddings=False),
}

# Scaled-down shapes that keep each layout's structure: 2.6B (no num_noise_heads key: pairs,
# head_dim implied by hidden / heads, tied) with and without GQA; 12.7B (num_noise_heads with
# grouped ratio 4, head_dim explicit and != hidden / heads, one key/value pair per group,
# untied) and a variant where two groups share one key/value pair.
TINY = {
    "2.6b": dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=4, head_dim=None, num_noise_heads=None,
                 max_position_embeddings=64, rope_theta=10000.0, tie_word_embeddings=True),
    "2.6b-gqa": dict(vocab_size=96, hidden_size=64, intermediate_size=48, num_hidden_layers=3,
                     num_attention_heads=8, num_key_value_heads=4, head_dim=None, num_noise_heads=None,
                     max_position_embeddings=64, rope_theta=10000.0, tie_word_embeddings=True),
    "12.7b": dict(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=10, num_key_value_heads=4, head_dim=8, num_noise_heads=2,
                  max_position_embeddings=64, rope_theta=1000000.0, tie_word_embeddings=False),
    "12.7b-shared-kv": dict(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                            num_attention_heads=20, num_key_value_heads=4, head_dim=8, num_noise_heads=4,
                            max_position_embeddings=64, rope_theta=1000000.0, tie_word_embeddings=False),
}


def make_config(shape="2.6b", size="tiny", torch_dtype="bfloat16", **overrides):
    """A config.json dict in the published spelling. shape: a key of TINY (size="tiny") or of
    PUBLISHED (size="full"); overrides replace any key (None removes it)."""
    base = dict((TINY if size == "tiny" else PUBLISHED)[shape])
    base.update(overrides)
    c = {
        "architectures": ["MotifForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_motif.MotifConfig",
                     "AutoModelForCausalLM": "modeling_motif.MotifForCausalLM"},
        "model_type": "Motif",
        "hidden_act": "poly_norm",
        "rms_norm_eps": 1e-06,
        "attn_rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "use_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_cache": True,
        "torch_dtype": torch_dtype,
        "transformers_version": "4.51.3",
    }
    c.update(base)
    if c.get("num_noise_heads") is not None:
        c["k_ratio"] = 1
    return {k: v for k, v in c.items() if v is not None or k == "rope_scaling"}


def dims(cfg):
    """(C, H, Hkv, d, G, P, F): hidden, query heads, key/value heads, head size, noise heads
    (groups), key/value pairs, MLP width. Checks the divisibility the layout needs."""
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or H
    d = cfg.get("head_dim") or C // H
    G = cfg.get("num_noise_heads") or H // 2
    P = Hkv // 2
    if H % G or H // G < 2 or Hkv % 2 or G % P:
        raise ValueError(f"Motif layout needs G | H with H/G >= 2, even Hkv and P | G "
                         f"(H={H}, Hkv={Hkv}, G={G})")
    if cfg.get("k_ratio", 1) != 1:
        raise ValueError("k_ratio != 1: no published model uses it and vLLM's Motif code assumes 1")
    if cfg.get("use_bias") or cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("biases: no published Motif-2 model has them")
    if cfg.get("hidden_act", "poly_norm") != "poly_norm":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r}: Motif-2 uses poly_norm")
    if cfg.get("rope_scaling"):
        raise ValueError("rope_scaling: the reference knows plain RoPE (no published Motif-2 "
                         "config.json in the sources sets a scaling)")
    return C, H, Hkv, d, G, P, cfg["intermediate_size"]


def head_layout(cfg):
    """[(signal query heads, noise query head, key/value pair)] per group g, in query order."""
    _, H, _, _, G, P, _ = dims(cfg)
    S = H // G
    return [(list(range(g * S, g * S + S - 1)), g * S + S - 1, g // (G // P)) for g in range(G)]


def lambda_init(layer):
    """Motif's lambda_init: the paper's 0.8 - 0.6 exp(-0.3 (l - 1)) applied to the 0-based layer
    index (so layer 0 gets 0.8 - 0.6 e^0.3 < 0); DiffLlama applies it as 0.8 - 0.6 exp(-0.3 l)."""
    return 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))


# ------------------------------------------------------------------ tensors


def tensor_shapes(cfg):
    """{name: shape} of a published checkpoint; linear weights are (out_features, in_features)."""
    C, H, Hkv, d, G, P, F = dims(cfg)
    V = cfg["vocab_size"]
    s = {"model.embed_tokens.weight": (V, C)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (C,)
        s[p + "self_attn.q_proj.weight"] = (H * d, C)
        s[p + "self_attn.k_proj.weight"] = (Hkv * d, C)
        s[p + "self_attn.v_proj.weight"] = (Hkv * d, C)
        s[p + "self_attn.o_proj.weight"] = (C, 2 * (H - G) * d)
        for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            s[p + "self_attn." + n] = (d,)
        s[p + "self_attn.subln.weight"] = (2 * d,)
        s[p + "post_attention_layernorm.weight"] = (C,)
        s[p + "mlp.gate_proj.weight"] = (F, C)
        s[p + "mlp.up_proj.weight"] = (F, C)
        s[p + "mlp.down_proj.weight"] = (C, F)
        s[p + "mlp.act_fn.weight"] = (3,)
        s[p + "mlp.act_fn.bias"] = (1,)
    s["model.norm.weight"] = (C,)
    if not cfg.get("tie_word_embeddings", False):
        s["lm_head.weight"] = (V, C)
    return s


def random_tensors(cfg, seed):
    """Seeded float32 weights whose every part moves the logits: linears N(0, 1/fan_in), embeddings
    and lm_head N(0, 0.5), RMSNorm/subln gains 1 + N(0, 0.2), lambda vectors N(0, 0.3) (lambda
    visibly away from lambda_init), PolyNorm weight 1/3 + N(0, 0.2) and bias N(0, 0.1)."""
    g = np.random.default_rng(seed)
    out = {}
    for name, shape in tensor_shapes(cfg).items():
        if name.endswith("norm.weight") or name.endswith("subln.weight"):
            a = 1.0 + 0.2 * g.standard_normal(shape)
        elif ".lambda_" in name:
            a = 0.3 * g.standard_normal(shape)
        elif name.endswith("act_fn.weight"):
            a = 1.0 / 3.0 + 0.2 * g.standard_normal(shape)
        elif name.endswith("act_fn.bias"):
            a = 0.1 * g.standard_normal(shape)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            a = 0.5 * g.standard_normal(shape)
        else:
            a = g.standard_normal(shape) / math.sqrt(shape[1])
        out[name] = a.astype(np.float32)
    return out


def read_checkpoint(path):
    """(config dict, {name: float32 numpy array}) of a checkpoint directory written in the
    published layout (model.safetensors, or shards listed by model.safetensors.index.json), read
    with the safetensors library."""
    from safetensors import safe_open

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    idx = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for fn in files:
        with safe_open(os.path.join(path, fn), framework="pt") as f:
            for n in f.keys():
                tensors[n] = f.get_tensor(n).to(torch.float32).numpy()
    return cfg, tensors


# ------------------------------------------------------------------ the model


def rmsnorm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def polynorm(z, w, b, eps=1e-6):
    """PolyNorm (arXiv:2411.03884): w0 N(z^3) + w1 N(z^2) + w2 N(z) + b with N(u) = u / sqrt(mean(u^2)
    + eps) over the last dimension, eps fixed at 1e-6 (not read from the config)."""
    def n(u):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)
    return w[0] * n(z**3) + w[1] * n(z**2) + w[2] * n(z) + b[0]


def rope(u, theta):
    """Rotate-half RoPE: u (B, n, T, d); pair (j, j + d/2) turns by angle t * theta^(-2j/d)."""
    T, d = u.shape[2], u.shape[3]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=u.dtype) / d)
    ang = torch.arange(T, dtype=u.dtype)[:, None] * inv[None, :]  # (T, d/2)
    c, s = torch.cos(ang), torch.sin(ang)
    a, b = u[..., : d // 2], u[..., d // 2 :]
    return torch.cat((a * c - b * s, b * c + a * s), dim=-1)


def causal_softmax(q, k):
    """q (B, T, d), k (B, T, d) -> the causal map (B, T, T) of softmax(q k^T / sqrt(d))."""
    T, d = q.shape[1], q.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, dim=-1)


def attention(cfg, l, P, x, maps=None, layout=None, li=None, kv=None):
    """Grouped differential attention of layer l: x (B, T, C), already normalised -> (B, T, C).
    maps: a dict that receives {(g, "noise") or (h, "signal"): map} when given. layout and li
    override head_layout(cfg) and lambda_init(l) (the tests' deliberate mistakes). kv: applied to
    the keys (after RoPE) and the values, as a KV cache stores them (e.g. rounding to BF16)."""
    B, T, _ = x.shape
    _, H, Hkv, d, G, _, _ = dims(cfg)
    p = f"model.layers.{l}.self_attn."
    q = (x @ P[p + "q_proj.weight"].T).view(B, T, H, d).transpose(1, 2)  # (B, H, T, d)
    k = (x @ P[p + "k_proj.weight"].T).view(B, T, Hkv, d).transpose(1, 2)  # (B, Hkv, T, d)
    v = (x @ P[p + "v_proj.weight"].T).view(B, T, Hkv, d).transpose(1, 2)
    theta = float(cfg.get("rope_theta", 10000.0))
    q, k = rope(q, theta), rope(k, theta)
    if kv is not None:
        k, v = kv(k), kv(v)
    li = lambda_init(l) if li is None else li
    lam = (torch.exp(torch.dot(P[p + "lambda_q1"], P[p + "lambda_k1"]))
           - torch.exp(torch.dot(P[p + "lambda_q2"], P[p + "lambda_k2"])) + li)
    w_sub, eps = P[p + "subln.weight"], cfg.get("attn_rms_norm_eps", 1e-5)
    outs = []
    for g, (signal, noise, j) in enumerate(layout or head_layout(cfg)):
        K1, K2 = k[:, 2 * j], k[:, 2 * j + 1]  # (B, T, d)
        V = torch.cat((v[:, 2 * j], v[:, 2 * j + 1]), dim=-1)  # [V1 | V2] (B, T, 2d)
        A2 = causal_softmax(q[:, noise], K2)  # computed once per group, shared by its signal heads
        if maps is not None:
            maps[(g, "noise")] = A2
        for h in signal:
            A1 = causal_softmax(q[:, h], K1)
            if maps is not None:
                maps[(h, "signal")] = A1
            O = (A1 - lam * A2) @ V  # (B, T, 2d)
            outs.append((1 - li) * rmsnorm(O, w_sub, eps))
    o = torch.cat(outs, dim=-1)  # (B, T, 2 (H - G) d), signal heads in query order
    return o @ P[p + "o_proj.weight"].T


def forward(cfg, P, tokens, **attn_kw):
    """tokens (B, T) int64 tensor -> logits (B, T, V) in the dtype of P. Pre-norm decoder layers:
    h = x + Attn(RMSNorm(x)); x = h + down(PolyNorm(gate(n)) * up(n)), n = RMSNorm(h). No scaling of
    embeddings, residuals or logits."""
    eps = cfg.get("rms_norm_eps", 1e-6)
    x = P["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = x + attention(cfg, l, P, rmsnorm(x, P[p + "input_layernorm.weight"], eps), **attn_kw)
        n = rmsnorm(h, P[p + "post_attention_layernorm.weight"], eps)
        a = polynorm(n @ P[p + "mlp.gate_proj.weight"].T, P[p + "mlp.act_fn.weight"], P[p + "mlp.act_fn.bias"])
        x = h + (a * (n @ P[p + "mlp.up_proj.weight"].T)) @ P[p + "mlp.down_proj.weight"].T
    head = P["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else P["lm_head.weight"]
    return rmsnorm(x, P["model.norm.weight"], eps) @ head.T


def params(tensors, dtype=torch.float64):
    return {k: torch.tensor(np.asarray(v), dtype=dtype) for k, v in tensors.items()}


def logits(cfg, tensors, tokens, dtype=torch.float64, **attn_kw):
    """numpy (B, T) ids -> numpy logits (B, T, V) computed in dtype."""
    with torch.no_grad():
        t = torch.as_tensor(np.asarray(tokens), dtype=torch.int64)
        return forward(cfg, params(tensors, dtype), t, **attn_kw).numpy()


def greedy(cfg, tensors, prompt, max_new, stop_ids=()):
    """Greedy continuation by full recomputation (no cache) in float64. Returns (ids, steps) with
    steps[i] = (float64 top-1 minus top-2 logit, max |float32 - float64| of that step's logits),
    what hf_reference.check_greedy needs."""
    P64, P32 = params(tensors, torch.float64), params(tensors, torch.float32)
    ids, steps = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new):
            if len(ids) >= cfg["max_position_embeddings"]:
                break
            t = torch.tensor([ids], dtype=torch.int64)
            l64 = forward(cfg, P64, t)[0, -1]
            l32 = forward(cfg, P32, t)[0, -1].double()
            top = torch.topk(l64, 2).values
            steps.append((float(top[0] - top[1]), float((l32 - l64).abs().max())))
            nxt = int(torch.argmax(l64))
            if nxt in stop_ids:
                break
            ids.append(nxt)
    return ids[len(prompt):], steps


# the accuracy rule of every HF reference (twice plain float32 PyTorch's error plus two ulps)
logits_bound = hr.logits_bound
check_logits = hr.check_logits
check_greedy = hr.check_greedy
round_to = hr.round_to
