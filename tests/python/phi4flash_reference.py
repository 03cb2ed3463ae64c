"""An independent PyTorch reference for Microsoft's Phi-4-mini-flash-reasoning (model_type
"phi4flash", the SambaY decoder-hybrid-decoder), written from a reading of the published modeling
file (docs/models/phi4flash.md names it and every fact used here), not from diffattn's C++ and not
copied from any source: Mamba-1 blocks with a sequential selective scan, sliding-window and full
differential attention with explicit masks and materialised attention maps, a YOCO cross-decoder
that reads the keys and values of one full-attention layer, and gated memory units (GMU) that reuse
the middle Mamba layer's scan output. No positional encoding anywhere.

Computes in float64 by default (float32 on request, to measure the error of a naive low-precision
run). Holds: a config builder for scaled-down configs that keep the published layer pattern, the
tensor names and shapes implied by a config, seeded random tensors, `forward` (logits of every
position), an incremental decoder with explicit per-sequence state (`prefill`, `step`), and
`greedy`.
"""

import math

import torch
import torch.nn.functional as F

# ------------------------------------------------------------------ config

# config.json keys the modeling code reads, with the defaults of the published
# configuration_phi4flash.py (the published config.json leaves the mamba_* keys at these).
MAMBA_DEFAULTS = {"mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
                  "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False}
SUBLN_EPS = 1e-5  # the per-head RMSNorm's eps is fixed in the modeling code, not read from config


def make_config(layers=8, hidden=32, heads=4, kv_heads=2, inter=40, vocab=97, window=5,
                d_state=16, d_conv=4, expand=2, eps=1e-5, torch_dtype="float32"):
    """A config.json dict in the published spelling, scaled down. layers % 4 == 0 keeps the
    published pattern: a self-decoder of alternating Mamba / sliding-window attention layers, the
    middle Mamba layer whose scan output is the GMU memory, one full-attention layer whose keys and
    values the cross-decoder reads, then alternating GMU / cross-attention layers."""
    c = {
        "architectures": ["Phi4FlashForCausalLM"], "model_type": "phi4flash",
        "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 1,
        "hidden_act": "silu", "hidden_size": hidden, "intermediate_size": inter,
        "initializer_range": 0.02, "layer_norm_eps": eps, "max_position_embeddings": 4096,
        "mb_per_layer": 2, "num_attention_heads": heads, "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads, "sliding_window": window,
        "tie_word_embeddings": True, "torch_dtype": torch_dtype, "use_cache": True,
        "mlp_bias": False, "lm_head_bias": False, "vocab_size": vocab,
    }
    for k, v in (("mamba_d_state", d_state), ("mamba_d_conv", d_conv), ("mamba_expand", expand)):
        if v != MAMBA_DEFAULTS[k]:
            c[k] = v
    check_config(c)
    return c


class Dims:
    """The sizes a config implies, checked once."""

    def __init__(self, cfg):
        check_config(cfg)
        self.L = cfg["num_hidden_layers"]
        self.C = cfg["hidden_size"]
        self.F = cfg["intermediate_size"]
        self.V = cfg["vocab_size"]
        self.H = cfg["num_attention_heads"]
        self.G = cfg["num_key_value_heads"]
        self.d = self.C // self.H                    # head_dim: hidden_size // heads, no key for it
        self.W = cfg["sliding_window"]
        self.N = cfg.get("mamba_d_state", 16)
        self.K = cfg.get("mamba_d_conv", 4)
        self.E = cfg.get("mamba_expand", 2) * self.C  # d_inner
        self.R = math.ceil(self.C / 16)              # dt_rank "auto"
        self.eps = cfg.get("layer_norm_eps", 1e-5)
        self.tied = cfg.get("tie_word_embeddings", True)


def check_config(cfg):
    L, H, G = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if L % 4:
        raise ValueError(f"num_hidden_layers={L}: SambaY needs a multiple of 4")
    if cfg.get("mb_per_layer", 2) != 2:
        # the sliding-window list and the cache layout in the modeling code assume Mamba on every
        # even layer; other values give an incoherent model there
        raise ValueError(f"mb_per_layer={cfg.get('mb_per_layer')}: only 2 is defined")
    if cfg["hidden_size"] % H or H % 2 or G % 2 or H % G:
        raise ValueError(f"heads {H}, kv heads {G}, hidden {cfg['hidden_size']}: need H | hidden, "
                         "H and G even, G | H")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={cfg.get('hidden_act')}: only silu is defined here")
    # The published modeling file ignores these three keys (its Mamba block keeps its own
    # defaults); a config asking for something else would be read differently by other engines.
    for k in ("mamba_dt_rank", "mamba_conv_bias", "mamba_proj_bias"):
        if cfg.get(k, MAMBA_DEFAULTS[k]) != MAMBA_DEFAULTS[k]:
            raise ValueError(f"{k}={cfg[k]}: the published modeling code ignores it")
    if cfg.get("sliding_window") is None or int(cfg["sliding_window"]) < 1:
        raise ValueError("sliding_window must be a positive int")


def layer_kinds(cfg):
    """One word per layer: mamba, swa (sliding-window attention), memory (the Mamba layer whose
    pre-gate scan output the GMUs read), full (full attention; its keys/values are the YOCO cache),
    gmu, cross (cross-attention on the YOCO keys/values)."""
    L = cfg["num_hidden_layers"]
    h = L // 2
    out = []
    for i in range(L):
        if i < h:
            out.append("mamba" if i % 2 == 0 else "swa")
        elif i == h:
            out.append("memory")
        elif i == h + 1:
            out.append("full")
        else:
            out.append("gmu" if i % 2 == 0 else "cross")
    return out


def lambda_init(depth):
    """DIFF Transformer's lambda_init (arXiv:2410.05258 eq. 2); depth is the 0-based index of the
    layer in the whole stack, Mamba layers counted."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


# ------------------------------------------------------------------ tensors

def tensor_specs(cfg):
    """(name, shape, kind) of every tensor in a published-layout checkpoint, in layer order.
    kind: w (matrix), b (bias), ln_w / ln_b (LayerNorm), conv_w, dt_b, A_log, D, lambda, subln.
    A_log and the four lambdas are stored as F32 in the published BF16 checkpoint."""
    D = Dims(cfg)
    C, E, N, K, R, H, G, d = D.C, D.E, D.N, D.K, D.R, D.H, D.G, D.d
    out = [("model.embed_tokens.weight", (D.V, C), "w")]
    for i, kind in enumerate(layer_kinds(cfg)):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (C,), "ln_w"), (p + "input_layernorm.bias", (C,), "ln_b")]
        a = p + "attn."
        if kind in ("mamba", "memory"):
            out += [(a + "in_proj.weight", (2 * E, C), "w"),
                    (a + "conv1d.weight", (E, 1, K), "conv_w"), (a + "conv1d.bias", (E,), "b"),
                    (a + "x_proj.weight", (R + 2 * N, E), "w"),
                    (a + "dt_proj.weight", (E, R), "w"), (a + "dt_proj.bias", (E,), "dt_b"),
                    (a + "A_log", (E, N), "A_log"), (a + "D", (E,), "D"),
                    (a + "out_proj.weight", (C, E), "w")]
        elif kind == "gmu":
            out += [(a + "in_proj.weight", (E, C), "w"), (a + "out_proj.weight", (C, E), "w")]
        else:
            q = H * d if kind == "cross" else H * d + 2 * G * d
            out += [(a + "Wqkv.weight", (q, C), "w"), (a + "Wqkv.bias", (q,), "b"),
                    (a + "out_proj.weight", (C, H * d), "w"), (a + "out_proj.bias", (C,), "b")]
            out += [(a + "inner_cross_attn." + n, (d,), "lambda")
                    for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")]
            out.append((a + "inner_cross_attn.subln.weight", (2 * d,), "subln"))
        out += [(p + "post_attention_layernorm.weight", (C,), "ln_w"),
                (p + "post_attention_layernorm.bias", (C,), "ln_b"),
                (p + "mlp.fc1.weight", (2 * D.F, C), "w"), (p + "mlp.fc2.weight", (C, D.F), "w")]
    out += [("model.final_layernorm.weight", (C,), "ln_w"), ("model.final_layernorm.bias", (C,), "ln_b")]
    if not D.tied:
        out.append(("lm_head.weight", (D.V, C), "w"))
    return out


def random_tensors(cfg, seed=0):
    """Seeded float64 tensors of every spec, at scales that keep activations O(1) at small widths
    (matrices N(0, 1/fan_in)), with a Mamba-like dt bias, an S4D-like A_log, and norms, biases,
    D and lambdas perturbed away from their trivial values so that a misplaced tensor shows."""
    g = torch.Generator().manual_seed(seed)

    def n(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float64) * std

    out = {}
    for name, shape, kind in tensor_specs(cfg):
        if kind in ("w", "conv_w"):
            x = n(shape, shape[-1] ** -0.5)
        elif kind in ("b", "ln_b"):
            x = n(shape, 0.1)
        elif kind in ("ln_w", "subln", "D"):
            x = 1.0 + n(shape, 0.1)
        elif kind == "lambda":
            x = n(shape, 0.1)
        elif kind == "A_log":
            x = torch.log(torch.arange(1, shape[1] + 1, dtype=torch.float64)).expand(shape) + n(shape, 0.1)
        elif kind == "dt_b":  # softplus^-1 of dt in [0.01, 0.5], log-uniform
            u = torch.rand(shape, generator=g, dtype=torch.float64)
            dt = torch.exp(math.log(0.01) + u * (math.log(0.5) - math.log(0.01)))
            x = dt + torch.log(-torch.expm1(-dt))
        else:
            raise AssertionError(kind)
        out[name] = x.contiguous()
    return out


# ------------------------------------------------------------------ blocks

def layer_norm(x, w, b, eps):  # LayerNorm with bias, biased variance over the last axis
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def mlp(x, t, p, F_):
    y = x @ t[p + "mlp.fc1.weight"].T           # (B, T, 2F): [gate | up]
    return (F.silu(y[..., :F_]) * y[..., F_:]) @ t[p + "mlp.fc2.weight"].T


def mamba(x, t, a, D, conv_state, ssm_state):
    """Mamba-1 mixer on x (B, T, C) with the previous K-1 conv inputs (B, E, K-1) and the scan
    state (B, E, N). Returns out (B, T, C), the pre-gate scan output y (B, T, E) and the new
    states. The scan is sequential: h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t, y_t = C_t h_t + D u_t."""
    T, E, K = x.shape[1], D.E, D.K
    xz = x @ t[a + "in_proj.weight"].T
    u, z = xz[..., :E], xz[..., E:]             # (B, T, E) each: the x branch, then the gate z
    hist = torch.cat([conv_state, u.transpose(1, 2)], dim=2)   # (B, E, K-1+T)
    w = t[a + "conv1d.weight"][:, 0, :]         # (E, K); tap K-1 multiplies the newest input
    conv = t[a + "conv1d.bias"][None, :, None].expand(-1, -1, T).clone()
    for k in range(K):
        conv = conv + w[None, :, k:k + 1] * hist[:, :, k:k + T]
    u = F.silu(conv).transpose(1, 2)             # (B, T, E)
    xdbl = u @ t[a + "x_proj.weight"].T          # (B, T, R + 2N): [dt | B | C]
    dt = F.softplus(xdbl[..., :D.R] @ t[a + "dt_proj.weight"].T + t[a + "dt_proj.bias"])
    Bm, Cm = xdbl[..., D.R:D.R + D.N], xdbl[..., D.R + D.N:]
    A = -torch.exp(t[a + "A_log"])               # (E, N)
    h = ssm_state
    ys = []
    for s in range(T):
        h = torch.exp(dt[:, s, :, None] * A) * h + dt[:, s, :, None] * Bm[:, s, None, :] * u[:, s, :, None]
        ys.append((h * Cm[:, s, None, :]).sum(-1) + t[a + "D"] * u[:, s])
    y = torch.stack(ys, dim=1)                   # (B, T, E), before the gate
    out = (y * F.silu(z)) @ t[a + "out_proj.weight"].T
    return out, y, hist[:, :, hist.shape[2] - (K - 1):], h


def diff_attention(xq, k, v, qpos, kpos, t, a, D, depth, window, mistake=None):
    """Differential attention (arXiv:2410.05258) as Phi-4-flash lays it out. xq (B, Tq, H*d) are
    the projected queries; k, v (B, Tk, G, d) with absolute positions kpos; a query at position i
    sees key j iff j <= i and (no window or i - j < window). Query heads 2h and 2h+1 form
    differential head h (adjacent pairs), as do key/value heads; differential head h reads key pair
    h // (H/G); its value is the pair's two value heads side by side (2d wide)."""
    B, Tq = xq.shape[:2]
    H, G, d = D.H, D.G, D.d
    q = xq.view(B, Tq, H, d)
    if mistake == "head_halves":  # DiffLlama's layout, to show the layouts differ
        q1, q2 = q[:, :, :H // 2], q[:, :, H // 2:]
        k1, k2, v1, v2 = k[:, :, :G // 2], k[:, :, G // 2:], v[:, :, :G // 2], v[:, :, G // 2:]
    else:
        q1, q2 = q[:, :, 0::2], q[:, :, 1::2]       # (B, Tq, H/2, d)
        k1, k2, v1, v2 = k[:, :, 0::2], k[:, :, 1::2], v[:, :, 0::2], v[:, :, 1::2]
    grp = H // G
    kv = torch.arange(H // 2) // grp                # key/value pair read by each differential head
    allowed = (kpos[None, :] <= qpos[:, None])
    if window is not None:
        allowed &= (qpos[:, None] - kpos[None, :]) < window
    bias = torch.zeros(allowed.shape, dtype=xq.dtype).masked_fill(~allowed, float("-inf"))
    scale = d ** -0.5

    def attn_map(qq, kk):  # (B, H/2, Tq, Tk), materialised
        s = torch.einsum("bqhd,bkhd->bhqk", qq, kk[:, :, kv]) * scale + bias
        return torch.softmax(s, dim=-1)

    vv = torch.cat([v1[:, :, kv], v2[:, :, kv]], dim=-1)        # (B, Tk, H/2, 2d)
    o1 = torch.einsum("bhqk,bkhe->bqhe", attn_map(q1, k1), vv)
    o2 = torch.einsum("bhqk,bkhe->bqhe", attn_map(q2, k2), vv)
    p = a + "inner_cross_attn."
    li = lambda_init(depth)
    lam = (torch.exp((t[p + "lambda_q1"] * t[p + "lambda_k1"]).sum())
           - torch.exp((t[p + "lambda_q2"] * t[p + "lambda_k2"]).sum()) + li)
    o = rms_norm(o1 - lam * o2, t[p + "subln.weight"], SUBLN_EPS) * (1 - li)
    # (B, Tq, H/2, 2d) flattens to (B, Tq, H*d): differential head h fills heads 2h, 2h+1
    return o.reshape(B, Tq, H * d) @ t[a + "out_proj.weight"].T + t[a + "out_proj.bias"]


# ------------------------------------------------------------------ state

class State:
    """Per-sequence inference state after `pos` tokens (a batch of B sequences of equal length):
    conv[i] (B, E, K-1) the last K-1 conv inputs and ssm[i] (B, E, N) the scan state of each
    self-decoder Mamba layer; swa[i] = (k, v), each (B, min(pos, W), G, d), the keys/values of the
    last W positions of each sliding-window layer; kv = (k, v), each (B, pos, G, d), the
    full-attention layer's keys/values, read by every cross-attention layer. The GMU memory is
    recomputed for each token by the memory layer, so it is no state."""

    def __init__(self, cfg, B, dtype=torch.float64):
        D = Dims(cfg)
        self.pos = 0
        self.conv, self.ssm, self.swa = {}, {}, {}
        for i, kind in enumerate(layer_kinds(cfg)):
            if kind in ("mamba", "memory"):
                self.conv[i] = torch.zeros(B, D.E, D.K - 1, dtype=dtype)
                self.ssm[i] = torch.zeros(B, D.E, D.N, dtype=dtype)
            elif kind == "swa":
                self.swa[i] = (torch.zeros(B, 0, D.G, D.d, dtype=dtype),) * 2
        self.kv = (torch.zeros(B, 0, D.G, D.d, dtype=dtype),) * 2

    def tensors(self):
        """Every state tensor by a stable name, for comparisons."""
        out = {"kv.k": self.kv[0], "kv.v": self.kv[1]}
        for i in self.conv:
            out[f"{i}.conv"], out[f"{i}.ssm"] = self.conv[i], self.ssm[i]
        for i, (k, v) in self.swa.items():
            out[f"{i}.k"], out[f"{i}.v"] = k, v
        return out


MISTAKES = ("window_plus_one", "window_minus_one", "gmu_memory_from_earlier_mamba",
            "gmu_memory_after_gate", "lambda_init_depth_plus_one", "lambda_init_attention_count",
            "head_halves")


def _run(cfg, t, tokens, state, last_only_from=None, mistake=None):
    """Runs tokens (B, T) after state.pos earlier tokens, updating state in place. With
    last_only_from=i, layers i.. see only the last position (YOCO prefill: the cross-decoder needs
    nothing of the earlier positions but the shared keys/values). Returns the final hidden states."""
    D = Dims(cfg)
    kinds = layer_kinds(cfg)
    B, T = tokens.shape
    pos = torch.arange(state.pos, state.pos + T)
    x = t["model.embed_tokens.weight"][tokens]        # no scaling, no positional encoding
    memory = None
    earlier_memory = None
    attn_count = 0
    for i, kind in enumerate(kinds):
        if last_only_from is not None and i == last_only_from:
            x, pos = x[:, -1:], pos[-1:]
            memory = memory[:, -1:]
            earlier_memory = None if earlier_memory is None else earlier_memory[:, -1:]
        p = f"model.layers.{i}."
        a = p + "attn."
        h = layer_norm(x, t[p + "input_layernorm.weight"], t[p + "input_layernorm.bias"], D.eps)
        depth = i
        if mistake == "lambda_init_depth_plus_one":
            depth = i + 1
        elif mistake == "lambda_init_attention_count":
            depth = attn_count
        if kind in ("mamba", "memory"):
            out, y, state.conv[i], state.ssm[i] = mamba(h, t, a, D, state.conv[i], state.ssm[i])
            if kind == "memory":
                memory = y
                if mistake == "gmu_memory_after_gate":
                    xz = h @ t[a + "in_proj.weight"].T
                    memory = y * F.silu(xz[..., D.E:])
            elif i == len(kinds) // 2 - 2:
                earlier_memory = y
        elif kind == "gmu":
            m = earlier_memory if mistake == "gmu_memory_from_earlier_mamba" else memory
            out = (F.silu(h @ t[a + "in_proj.weight"].T) * m) @ t[a + "out_proj.weight"].T
        else:
            attn_count += 1
            qkv = h @ t[a + "Wqkv.weight"].T + t[a + "Wqkv.bias"]
            Tq = qkv.shape[1]
            window = None
            if kind == "cross":
                k, v = state.kv
                kpos = torch.arange(state.pos + T - k.shape[1], state.pos + T)
            else:
                hq = D.H * D.d
                kn = qkv[..., hq:hq + D.G * D.d].reshape(B, Tq, D.G, D.d)
                vn = qkv[..., hq + D.G * D.d:].reshape(B, Tq, D.G, D.d)
                if kind == "full":
                    k = torch.cat([state.kv[0], kn], 1)
                    v = torch.cat([state.kv[1], vn], 1)
                    state.kv = (k, v)
                    kpos = torch.arange(0, state.pos + T)
                else:
                    window = D.W + (mistake == "window_plus_one") - (mistake == "window_minus_one")
                    k = torch.cat([state.swa[i][0], kn], 1)
                    v = torch.cat([state.swa[i][1], vn], 1)
                    kpos = torch.arange(state.pos + T - k.shape[1], state.pos + T)
                    keep = min(k.shape[1], D.W)  # the cache is bounded by the window
                    state.swa[i] = (k[:, k.shape[1] - keep:], v[:, v.shape[1] - keep:])
            out = diff_attention(qkv[..., :D.H * D.d], k, v, pos, kpos, t, a, D, depth, window,
                                 mistake)
        x = x + out
        h = layer_norm(x, t[p + "post_attention_layernorm.weight"],
                       t[p + "post_attention_layernorm.bias"], D.eps)
        x = x + mlp(h, t, p, D.F)
    state.pos += T
    return layer_norm(x, t["model.final_layernorm.weight"], t["model.final_layernorm.bias"], D.eps)


def _cast(t, dtype):
    return {k: v.to(dtype) for k, v in t.items()}


def _logits(cfg, t, x):
    head = t["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", True) else t["lm_head.weight"]
    return x @ head.T


def forward(cfg, tensors, tokens, dtype=torch.float64, mistake=None):
    """Logits (B, T, V) of every position of tokens (B, T) from an empty state."""
    if mistake is not None and mistake not in MISTAKES:
        raise ValueError(mistake)
    t = _cast(tensors, dtype)
    tokens = torch.as_tensor(tokens)
    with torch.no_grad():
        return _logits(cfg, t, _run(cfg, t, tokens, State(cfg, tokens.shape[0], dtype), mistake=mistake))


def prefill(cfg, tensors, tokens, dtype=torch.float64):
    """(logits of the last position (B, V), State after all of tokens). The cross-decoder runs on
    the last position only; everything it needs of the others is in the state."""
    t = _cast(tensors, dtype)
    tokens = torch.as_tensor(tokens)
    st = State(cfg, tokens.shape[0], dtype)
    with torch.no_grad():
        x = _run(cfg, t, tokens, st, last_only_from=cfg["num_hidden_layers"] // 2 + 2)
        return _logits(cfg, t, x)[:, -1], st


def extend(cfg, tensors, state, tokens, dtype=torch.float64):
    """Chunked prefill: tokens (B, T) after state.pos tokens; logits of the last position (B, V).
    The state afterwards equals prefill's of all the tokens so far."""
    t = _cast(tensors, dtype)
    with torch.no_grad():
        x = _run(cfg, t, torch.as_tensor(tokens), state, last_only_from=cfg["num_hidden_layers"] // 2 + 2)
        return _logits(cfg, t, x)[:, -1]


def step(cfg, tensors, state, token, dtype=torch.float64):
    """One decode step: token (B,) after state.pos tokens. Returns logits (B, V); updates state."""
    t = _cast(tensors, dtype)
    with torch.no_grad():
        x = _run(cfg, t, torch.as_tensor(token).reshape(-1, 1), state)
        return _logits(cfg, t, x)[:, -1]


def greedy(cfg, tensors, prompt, n, dtype=torch.float64):
    """n greedy tokens after prompt (B, T) by prefill then n - 1 decode steps: (B, n)."""
    logits, st = prefill(cfg, tensors, prompt, dtype)
    out = [logits.argmax(-1)]
    for _ in range(n - 1):
        out.append(step(cfg, tensors, st, out[-1], dtype).argmax(-1))
    return torch.stack(out, dim=1)


# ------------------------------------------------------------------ memory arithmetic

def state_elements(cfg, tokens):
    """Elements of per-sequence state after `tokens` tokens, by part: mamba (conv K-1 inputs and
    scan state of each self-decoder Mamba layer), swa (keys and values of min(tokens, W) positions
    per sliding-window layer), yoco_kv (keys and values of every position, one layer)."""
    D = Dims(cfg)
    kinds = layer_kinds(cfg)
    n_mamba = sum(k in ("mamba", "memory") for k in kinds)
    n_swa = kinds.count("swa")
    return {"mamba": n_mamba * D.E * (D.K - 1 + D.N),
            "swa": n_swa * 2 * min(tokens, D.W) * D.G * D.d,
            "yoco_kv": 2 * tokens * D.G * D.d}
