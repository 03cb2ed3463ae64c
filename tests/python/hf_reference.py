"""An independent PyTorch reference for Hugging Face LlamaForCausalLM and DiffLlamaForCausalLM
checkpoints, written from the models' semantics (rotate-half RoPE, llama3 frequency scaling,
DiffLlama's head halves), not from diffattn's C++ nor copied from transformers.

Also: seeded random weights, a checkpoint writer (config.json in the 4.x or 5.x spelling,
generation_config.json, one or several safetensors shards with their index, F32/BF16/F16 with
round-to-nearest-even) and hf_to_project, the row permutation that turns a checkpoint into a
diffattn/1 directory (docs/FORMAT.md) with the same logits.
"""

import json
import math
import os
import struct

import numpy as np
import torch

# ------------------------------------------------------------------ config

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def make_config(model="llama", hidden=32, layers=2, heads=4, kv_heads=2, head_dim=None,
                inter=64, vocab=96, max_pos=128, theta=10000.0, eps=1e-5, tied=False,
                scaling=None, attention_bias=False, mlp_bias=False, torch_dtype="float32",
                bos=1, eos=2):
    """A realistic config.json dict (the 4.x spelling; write_hf_checkpoint can respell it).
    scaling: None (default RoPE) or a rope_scaling dict such as LLAMA3_SCALING."""
    diff = model == "diffllama"
    c = {
        "architectures": ["DiffLlamaForCausalLM" if diff else "LlamaForCausalLM"],
        "model_type": "diffllama" if diff else "llama",
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "hidden_act": "silu",
        "max_position_embeddings": max_pos, "rms_norm_eps": eps, "rope_theta": theta,
        "rope_scaling": dict(scaling) if scaling else None,
        "tie_word_embeddings": tied, "attention_bias": attention_bias,
        "attention_dropout": 0.0, "bos_token_id": bos, "eos_token_id": eos,
        "torch_dtype": torch_dtype, "initializer_range": 0.02, "use_cache": True,
        "transformers_version": "4.46.0",
    }
    if head_dim is not None:
        c["head_dim"] = head_dim
    if diff:
        c["lambda_std_dev"] = 0.1
    else:
        c["mlp_bias"] = mlp_bias
        c["pretraining_tp"] = 1
    return c


def _scaling(d):
    """A scaling dict with its kind under "rope_type" (older 4.x files say "type");
    None for default RoPE."""
    if not d:
        return None
    d = dict(d)
    kind = d.pop("type", None)
    d["rope_type"] = d.get("rope_type", kind) or "default"
    return None if d["rope_type"] == "default" else d


def rope_of(cfg):
    """(theta, scaling or None) from either spelling: 4.x rope_theta + rope_scaling
    ({"rope_type" or "type": ...}), 5.x rope_parameters {"rope_type", "rope_theta", ...}."""
    if cfg.get("rope_parameters") is not None:
        rp = dict(cfg["rope_parameters"])
        theta = float(rp.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        return theta, _scaling(rp)
    return float(cfg.get("rope_theta", 10000.0)), _scaling(cfg.get("rope_scaling"))


def head_dim_of(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def is_diff(cfg):
    return cfg["model_type"] == "diffllama"


def respell(cfg, rope_spelling):
    """The config as transformers 4.x or 5.x writes it."""
    theta, sc = rope_of(cfg)
    c = {k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling", "rope_parameters")}
    if rope_spelling == "4.x":
        c["rope_theta"] = theta
        c["rope_scaling"] = dict(sc) if sc else None
    elif rope_spelling == "4.x-type":  # older 4.x files: "type" instead of "rope_type"
        c["rope_theta"] = theta
        if sc:
            sc["type"] = sc.pop("rope_type")
        c["rope_scaling"] = sc
    elif rope_spelling == "5.x":
        rp = {"rope_type": "default", "rope_theta": theta}
        rp.update(sc or {})
        c["rope_parameters"] = rp
        if "torch_dtype" in c:
            c["dtype"] = c.pop("torch_dtype")
        c["transformers_version"] = "5.0.0"
    else:
        raise ValueError(f"rope_spelling {rope_spelling!r}: expected 4.x, 4.x-type or 5.x")
    return c


# ------------------------------------------------------------------ tensors


def tensor_shapes(cfg):
    """{name: shape} of a checkpoint, linear weights (out_features, in_features)."""
    C, V, F = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    H, G, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg)
    ab, mb = cfg.get("attention_bias", False), cfg.get("mlp_bias", False) and not is_diff(cfg)
    s = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not cfg.get("tie_word_embeddings", False):
        s["lm_head.weight"] = (V, C)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        for n, (o, i) in {"q": (H * d, C), "k": (G * d, C), "v": (G * d, C), "o": (C, H * d)}.items():
            s[p + f"self_attn.{n}_proj.weight"] = (o, i)
            if ab:
                s[p + f"self_attn.{n}_proj.bias"] = (o,)
        if is_diff(cfg):
            for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                s[p + "self_attn." + n] = (d,)
        s[p + "input_layernorm.weight"] = (C,)
        s[p + "post_attention_layernorm.weight"] = (C,)
        for n, (o, i) in {"gate": (F, C), "up": (F, C), "down": (C, F)}.items():
            s[p + f"mlp.{n}_proj.weight"] = (o, i)
            if mb:
                s[p + f"mlp.{n}_proj.bias"] = (o,)
    return s


def random_tensors(cfg, seed, std=None):
    """Seeded float32 weights: linears N(0, std) with std = 1/sqrt(fan_in) by default (logits of
    order one, every layer matters), embeddings N(0, 0.5), norm gains 1 + N(0, 0.2) (a dropped
    gain shows), biases N(0, 0.1), DiffLlama lambdas N(0, lambda_std_dev)."""
    g = np.random.default_rng(seed)
    lam = cfg.get("lambda_std_dev", 0.1)
    out = {}
    for name, shape in tensor_shapes(cfg).items():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            a = 1.0 + 0.2 * g.standard_normal(shape)
        elif ".lambda_" in name:
            a = lam * g.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.1 * g.standard_normal(shape)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            a = 0.5 * g.standard_normal(shape)
        else:
            a = (std or 1.0 / math.sqrt(shape[1])) * g.standard_normal(shape)
        out[name] = a.astype(np.float32)
    return out


# ------------------------------------------------------------------ safetensors

_ELEM = {"F32": 4, "F16": 2, "BF16": 2}


def round_to(a, dtype):
    """float32 array -> (raw little-endian bytes of dtype, the float32 values they hold)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.astype("<f4").tobytes(), a.copy()
    if dtype == "F16":
        h = a.astype("<f2")  # numpy rounds to nearest even
        return h.tobytes(), h.astype(np.float32)
    if dtype == "BF16":
        # round to nearest even on the 16 dropped bits (values here are finite)
        u = a.view("<u4").astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        b = u.astype("<u2")
        return b.tobytes(), (b.astype(np.uint32) << 16).view(np.float32)
    raise ValueError(f"dtype {dtype!r}: expected F32, BF16 or F16")


def write_safetensors_raw(path, entries, metadata=None):
    """entries: [(name, dtype, shape, raw bytes)] written in that order."""
    header, off = {}, 0
    for name, dt, shape, raw in entries:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for e in entries:
            f.write(e[3])


TORCH_DTYPE = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def write_hf_checkpoint(path, config, tensors, dtype="F32", shards=1, rope_spelling="4.x",
                        generation=None):
    """Writes a Hugging Face checkpoint directory: config.json (rope in the 4.x or 5.x spelling,
    torch_dtype naming dtype), generation_config.json, and model.safetensors or
    model-0000i-of-0000n.safetensors + model.safetensors.index.json. Returns the float32 tensors
    exactly as stored (rounded to BF16/F16), which is what a reference must compute with."""
    os.makedirs(path, exist_ok=True)
    cfg = dict(config)
    cfg["torch_dtype"] = TORCH_DTYPE[dtype]
    cfg = respell(cfg, rope_spelling)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    gen = {"_from_model_config": True, "bos_token_id": config.get("bos_token_id"),
           "eos_token_id": config.get("eos_token_id"), "transformers_version": cfg["transformers_version"]}
    if generation:
        gen.update(generation)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    names = sorted(tensors)
    stored, entries = {}, []
    for n in names:
        raw, back = round_to(tensors[n], dtype)
        stored[n] = back.reshape(np.shape(tensors[n]))
        entries.append((n, dtype, np.shape(tensors[n]), raw))
    meta = {"format": "pt"}
    if shards == 1:
        write_safetensors_raw(os.path.join(path, "model.safetensors"), entries, meta)
        return stored
    # contiguous runs of names, as transformers' size-based splitting produces
    groups = np.array_split(np.arange(len(entries)), shards)
    weight_map, total = {}, 0
    for s, idx in enumerate(groups):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = [entries[i] for i in idx]
        write_safetensors_raw(os.path.join(path, fname), part, meta)
        for e in part:
            weight_map[e[0]] = fname
            total += len(e[3])
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return stored


def read_hf_checkpoint(path):
    """(config dict, {name: float32 array}) of a checkpoint directory, one file or sharded."""
    from torch_model import read_safetensors

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
        t, _ = read_safetensors(os.path.join(path, fn))
        tensors.update(t)
    return cfg, tensors


# ------------------------------------------------------------------ the model


def inv_freq(cfg, d, dtype=torch.float64):
    """(d/2,) RoPE frequencies theta^(-2j/d), with llama3 scaling when the config asks for it."""
    theta, sc = rope_of(cfg)
    j = torch.arange(0, d, 2, dtype=dtype)
    f = 1.0 / (theta ** (j / d))
    if sc is None:
        return f
    kind = sc["rope_type"]
    if kind != "llama3":
        raise ValueError(f"rope_type {kind!r}: the reference knows default and llama3")
    factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
    L = sc["original_max_position_embeddings"]
    wavelen = 2 * math.pi / f
    low_wl, high_wl = L / lo, L / hi
    s = (L / wavelen - lo) / (hi - lo)
    medium = (1 - s) * f / factor + s * f
    return torch.where(wavelen > low_wl, f / factor, torch.where(wavelen < high_wl, f, medium))


def rope_rotate_half(u, cos, sin):
    """u (B, n, T, d); cos, sin (T, d/2): pair (j, j + d/2) rotates by angle t * inv_freq_j."""
    h = u.shape[-1] // 2
    a, b = u[..., :h], u[..., h:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def rmsnorm(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def linear(x, P, name):
    y = x @ P[name + ".weight"].T
    b = P.get(name + ".bias")
    return y if b is None else y + b


def causal_softmax(q, k, d):
    """q (B, n, T, d), k (B, n, T, d) -> (B, n, T, T)."""
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, dim=-1)


def lambda_init(layer):
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def attention(cfg, l, P, x):
    """x (B, T, C), already normalised -> (B, T, C)."""
    B, T, _ = x.shape
    H, G, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg)
    rep = H // G
    p = f"model.layers.{l}.self_attn."
    q = linear(x, P, p + "q_proj").view(B, T, H, d).transpose(1, 2)  # (B, H, T, d)
    k = linear(x, P, p + "k_proj").view(B, T, G, d).transpose(1, 2)  # (B, G, T, d)
    v = linear(x, P, p + "v_proj").view(B, T, G, d).transpose(1, 2)
    ang = torch.arange(T, dtype=x.dtype)[:, None] * inv_freq(cfg, d, x.dtype)[None, :]  # (T, d/2)
    cos, sin = torch.cos(ang), torch.sin(ang)
    q, k = rope_rotate_half(q, cos, sin), rope_rotate_half(k, cos, sin)
    k = k.repeat_interleave(rep, dim=1)  # query head i reads kv head i // rep
    v = v.repeat_interleave(rep, dim=1)  # (B, H, T, d)
    A = causal_softmax(q, k, d)  # (B, H, T, T)
    if not is_diff(cfg):
        o = A @ v  # (B, H, T, d)
        return linear(o.transpose(1, 2).reshape(B, T, H * d), P, p + "o_proj")
    # DiffLlama: value of differential head i is [v_rep(i) | v_rep(i + H/2)], used by both halves
    h2 = H // 2
    vcat = torch.cat((v[:, :h2], v[:, h2:]), dim=-1).repeat(1, 2, 1, 1)  # (B, H, T, 2d)
    o = A @ vcat
    o1, o2 = o[:, :h2], o[:, h2:]  # (B, H/2, T, 2d): map 1 from query head i, map 2 from i + H/2
    li = lambda_init(l)
    lam = (torch.exp(torch.sum(P[p + "lambda_q1"] * P[p + "lambda_k1"]))
           - torch.exp(torch.sum(P[p + "lambda_q2"] * P[p + "lambda_k2"])) + li)
    o = (1 - li) * rmsnorm(o1 - lam * o2, None, cfg["rms_norm_eps"])
    return linear(o.transpose(1, 2).reshape(B, T, H * d), P, p + "o_proj")


def forward(cfg, P, tokens):
    """tokens (B, T) int64 tensor -> logits (B, T, V) in the dtype of P."""
    eps = cfg["rms_norm_eps"]
    x = P["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = x + attention(cfg, l, P, rmsnorm(x, P[p + "input_layernorm.weight"], eps))
        n = rmsnorm(h, P[p + "post_attention_layernorm.weight"], eps)
        f = torch.nn.functional.silu(linear(n, P, p + "mlp.gate_proj")) * linear(n, P, p + "mlp.up_proj")
        x = h + linear(f, P, p + "mlp.down_proj")
    head = P["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else P["lm_head.weight"]
    return rmsnorm(x, P["model.norm.weight"], eps) @ head.T


def params(tensors, dtype=torch.float64):
    return {k: torch.tensor(np.asarray(v), dtype=dtype) for k, v in tensors.items()}


def logits(cfg, tensors, tokens, dtype=torch.float64):
    """numpy (B, T) ids -> numpy logits (B, T, V) computed in dtype."""
    with torch.no_grad():
        return forward(cfg, params(tensors, dtype), torch.as_tensor(np.asarray(tokens), dtype=torch.int64)).numpy()


def greedy(cfg, tensors, prompt, max_new, stop_ids=(), max_len=None):
    """Greedy continuation by full recomputation in float64 (no cache). Returns (ids, steps):
    steps[i] = (top-1 minus top-2 logit of the float64 reference, max |float32 - float64| of
    that step's logits), what the divergence rule needs."""
    P64, P32 = params(tensors, torch.float64), params(tensors, torch.float32)
    ids, steps = list(prompt), []
    cap = max_len or cfg["max_position_embeddings"]
    with torch.no_grad():
        for _ in range(max_new):
            if len(ids) >= cap:
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


# ------------------------------------------------------------------ tolerance rules


def logits_bound(l64, l32):
    """The error a float32 implementation may have against the float64 reference: twice plain
    float32 PyTorch's, plus a floor of two float32 ulps of the logits' scale."""
    scale = float(np.abs(l64).max())
    return 2.0 * float(np.abs(l32 - l64).max()) + 2 * 2.0**-24 * scale


def check_logits(got, l64, l32, what=""):
    err = float(np.abs(np.asarray(got, np.float64) - l64).max())
    bound = logits_bound(l64, l32)
    assert err <= bound, (f"{what}: max |logits - float64 reference| = {err:.3g} > bound {bound:.3g} "
                          f"(float32 reference error {np.abs(l32 - l64).max():.3g}, scale {np.abs(l64).max():.3g})")
    return err, bound


def check_greedy(got, ref, steps, what=""):
    """got equals ref, or they part at a step where the float64 top-2 logits are closer than
    twice the float32 error (a tie that float32 rounding may legitimately break)."""
    got = list(got)
    if got == ref:
        return
    k = next((i for i in range(min(len(got), len(ref))) if got[i] != ref[i]), min(len(got), len(ref)))
    assert k < len(steps), f"{what}: continuation {got} != reference {ref} (diverge at {k}, past the reference's steps)"
    gap, e32 = steps[k]
    assert gap <= 2 * e32, (f"{what}: continuation {got} != reference {ref}: they part at step {k}, where "
                            f"the float64 top-2 gap {gap:.3g} exceeds 2 x float32 error {e32:.3g}")


# ------------------------------------------------------------------ mapping onto diffattn/1


def rope_permutation(d):
    """Within a q/k head: rotate-half pairs (j, j + d/2) become interleaved pairs (2j, 2j + 1).
    new[2j] = old[j], new[2j + 1] = old[j + d/2]."""
    perm = np.empty(d, dtype=np.int64)
    perm[0::2] = np.arange(d // 2)
    perm[1::2] = np.arange(d // 2) + d // 2
    return perm


def _heads_rows(w, heads, d, order, rope):
    """w (heads*d, C): head rows reordered as `order` (new head k <- old head order[k]), and
    inside each head the RoPE permutation when rope."""
    w = w.reshape(heads, d, -1)[np.asarray(order)]
    if rope:
        w = w[:, rope_permutation(d)]
    return w.reshape(len(order) * d, -1)


def hf_to_project(cfg, tensors):
    """A Hugging Face Llama/DiffLlama checkpoint (config dict, {name: array}) as a diffattn/1
    model (docs/FORMAT.md): returns (project config, {name: float32 array}) with the same
    logits. Llama -> standard; DiffLlama -> diff_v1 with H/2 pairs, Hkv/2 groups:
      query head i -> sub-head 2i, head i + H/2 -> 2i + 1 (map 1 and map 2 of pair i);
      kv head g -> key sub-head 2g, g + Hkv/2 -> 2g + 1; value group g = [v_g | v_(g + Hkv/2)];
      q/k rows inside a head permuted from rotate-half to interleaved RoPE; subln = ones.
    The project format has no biases and no RoPE scaling: those are a ValueError."""
    theta, sc = rope_of(cfg)
    if sc is not None:
        raise ValueError("hf_to_project: diffattn/1 has no RoPE scaling")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("hf_to_project: diffattn/1 has no biases")
    H, G, d, L = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg), cfg["num_hidden_layers"]
    diff = is_diff(cfg)
    pc = {"format": "diffattn/1", "attention": "diff_v1" if diff else "standard",
          "vocab_size": cfg["vocab_size"], "d_model": cfg["hidden_size"], "n_layers": L,
          "n_heads": H // 2 if diff else H, "n_kv_heads": G // 2 if diff else G, "head_dim": d,
          "ffn_dim": cfg["intermediate_size"], "max_seq_len": cfg["max_position_embeddings"],
          "rope_theta": theta, "norm_eps": cfg["rms_norm_eps"],
          "tie_embeddings": bool(cfg.get("tie_word_embeddings", False))}
    t = {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}
    out = {"embed_tokens.weight": t["model.embed_tokens.weight"], "norm.weight": t["model.norm.weight"]}
    if not pc["tie_embeddings"]:
        out["lm_head.weight"] = t["lm_head.weight"]
    if diff:
        q_order = [h for i in range(H // 2) for h in (i, i + H // 2)]
        k_order = [g for j in range(G // 2) for g in (j, j + G // 2)]
    else:
        q_order, k_order = list(range(H)), list(range(G))
    for l in range(L):
        s, p = f"model.layers.{l}.", f"layers.{l}."
        out[p + "attn_norm.weight"] = t[s + "input_layernorm.weight"]
        out[p + "ffn_norm.weight"] = t[s + "post_attention_layernorm.weight"]
        for n in ("gate", "up", "down"):
            out[p + f"ffn.{n}_proj.weight"] = t[s + f"mlp.{n}_proj.weight"]
        a = s + "self_attn."
        out[p + "attn.q_proj.weight"] = _heads_rows(t[a + "q_proj.weight"], H, d, q_order, True)
        out[p + "attn.k_proj.weight"] = _heads_rows(t[a + "k_proj.weight"], G, d, k_order, True)
        # (value group j of 2d = [v_j | v_(j + G/2)] is the same head order as the keys)
        out[p + "attn.v_proj.weight"] = _heads_rows(t[a + "v_proj.weight"], G, d, k_order, False)
        out[p + "attn.out_proj.weight"] = t[a + "o_proj.weight"]
        if diff:
            for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                out[p + "attn." + n] = t[a + n]
            out[p + "attn.subln.weight"] = np.ones(2 * d, dtype=np.float32)
    return pc, out
