"""Whole models in PyTorch: a diffattn/1 model directory (docs/FORMAT.md) or a Hugging Face
Llama / DiffLlama / Motif-2 directory as an nn.Module whose every attention layer runs the diffattn
operator (DiffTransformerLM, load), and save() back to a model directory."""

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from .modules import RMSNorm
from .ops import attention, diff_attention
from .rotary import apply_rotary_interleaved, rotary_cos_sin

__all__ = ["DiffTransformerLM", "load", "save"]


class _ModelAttention(nn.Module):
    """One attention layer of a diffattn/1 model (docs/FORMAT.md), tensor names as there."""

    def __init__(self, cfg, layer):
        super().__init__()
        C, H, G, D = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
        self.kind, self.H, self.G, self.D = cfg["attention"], H, G, D
        self.theta = cfg["rope_theta"]
        self.scaling = cfg.get("rope_scaling")
        nq = {"diff_v1": 2 * H, "diff_v2": 2 * H, "standard": H}[self.kind]
        nk = 2 * G if self.kind == "diff_v1" else G
        self.Dv = 2 * D if self.kind == "diff_v1" else D
        bias = bool(cfg.get("attention_bias", False))
        self.q_proj = nn.Linear(C, nq * D, bias=bias)
        self.k_proj = nn.Linear(C, nk * D, bias=bias)
        self.v_proj = nn.Linear(C, G * self.Dv, bias=bias)
        self.out_proj = nn.Linear(H * self.Dv, C, bias=bias)
        if self.kind == "diff_v1":
            li = cfg.get("lambda_init")
            # lambda_init_shift 1: Motif-2's schedule, exp(-0.3 (l - 1)) on the 0-based l
            shift = int(cfg.get("lambda_init_shift", 0))
            self.lambda_init = (0.8 - 0.6 * math.exp(-0.3 * (layer - shift)) if li is None else li)
            for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                setattr(self, n, nn.Parameter(torch.zeros(D)))
            self.subln = RMSNorm(2 * D, eps=cfg.get("subln_eps", cfg["norm_eps"]))
        elif self.kind == "diff_v2":
            self.lambda_proj = nn.Linear(C, H, bias=False)

    def forward(self, x):  # x (B, T, C), normalised
        B, T, _ = x.shape
        H, G, D = self.H, self.G, self.D
        cos, sin = rotary_cos_sin(T, D, self.theta, scaling=self.scaling, device=x.device)
        q = apply_rotary_interleaved(self.q_proj(x).view(B, T, -1, D), cos, sin)
        k = apply_rotary_interleaved(self.k_proj(x).view(B, T, -1, D), cos, sin)
        v = self.v_proj(x).view(B, T, G, self.Dv)
        if self.kind == "standard":
            o = attention(q, k, v, causal=True)
        elif self.kind == "diff_v1":
            lam = (torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
                   - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2)) + self.lambda_init)
            o = diff_attention(q, k, v, lam.reshape(1), causal=True)
            o = (1.0 - self.lambda_init) * self.subln(o)
        else:
            o = diff_attention(q, k, v, torch.sigmoid(self.lambda_proj(x)), causal=True)
        return self.out_proj(o.reshape(B, T, H * self.Dv))


class _FFN(nn.Module):
    def __init__(self, C, F_, bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(C, F_, bias=bias)
        self.up_proj = nn.Linear(C, F_, bias=bias)
        self.down_proj = nn.Linear(F_, C, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _PolyNormFFN(nn.Module):
    """Motif-2's MLP: down(PolyNorm(gate x) * up x), PolyNorm(z) = w0 N(z^3) + w1 N(z^2) +
    w2 N(z) + b with N(u) = u / sqrt(mean(u^2) + 1e-6) over the row (act_fn.weight (3), .bias (1))."""

    def __init__(self, C, F_):
        super().__init__()
        self.gate_proj = nn.Linear(C, F_, bias=False)
        self.up_proj = nn.Linear(C, F_, bias=False)
        self.down_proj = nn.Linear(F_, C, bias=False)
        self.act_fn = nn.Module()
        self.act_fn.weight = nn.Parameter(torch.full((3,), 1.0 / 3))
        self.act_fn.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        z = self.gate_proj(x)

        def n(u):
            return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + 1e-6)
        w, b = self.act_fn.weight, self.act_fn.bias
        a = w[0] * n(z ** 3) + w[1] * n(z ** 2) + w[2] * n(z) + b
        return self.down_proj(a * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        C, eps = cfg["d_model"], cfg["norm_eps"]
        self.attn_norm = RMSNorm(C, eps)
        self.attn = _ModelAttention(cfg, layer)
        self.ffn_norm = RMSNorm(C, eps)
        if cfg.get("mlp", "swiglu") == "polynorm":
            self.ffn = _PolyNormFFN(C, cfg["ffn_dim"])
        else:
            self.ffn = _FFN(C, cfg["ffn_dim"], bool(cfg.get("mlp_bias", False)))

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class DiffTransformerLM(nn.Module):
    """A diffattn/1 language model (docs/FORMAT.md) in PyTorch: named_parameters() are the
    checkpoint's tensor names, forward(tokens (B, T) int64) -> logits (B, T, vocab), every
    attention layer through the diffattn operator. config: the config.json dict."""

    def __init__(self, config):
        super().__init__()
        self.config = dict(config)
        cfg = self.config
        T_max = cfg.get("max_seq_len")
        self.max_seq_len = T_max
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["d_model"])
        self.layers = nn.ModuleList(_Layer(cfg, l) for l in range(cfg["n_layers"]))
        self.norm = RMSNorm(cfg["d_model"], cfg["norm_eps"])
        if not cfg["tie_embeddings"]:
            self.lm_head = nn.Linear(cfg["d_model"], cfg["vocab_size"], bias=False)

    def forward(self, tokens):
        op = "DiffTransformerLM"
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"{op}: tokens must be a torch.Tensor, got {type(tokens).__name__}")
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{op}: tokens must be an int64 (B, T) tensor, got "
                             f"{tokens.dtype} {tuple(tokens.shape)}")
        V = self.config["vocab_size"]
        # (value checks read the tensor: eager only; a compiled graph has no data-dependent
        # branch, and the embedding itself rejects an id out of range)
        if (not torch.compiler.is_compiling() and tokens.numel()
                and (int(tokens.min()) < 0 or int(tokens.max()) >= V)):
            raise ValueError(f"{op}: tokens must lie in [0, {V}), got values in "
                             f"[{int(tokens.min())}, {int(tokens.max())}]")
        if self.max_seq_len and tokens.shape[1] > self.max_seq_len:
            raise ValueError(f"{op}: {tokens.shape[1]} tokens is more than max_seq_len "
                             f"{self.max_seq_len}")
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        head = self.embed_tokens.weight if self.config["tie_embeddings"] else self.lm_head.weight
        return x @ head.t()

    def loss(self, tokens, targets):
        """Mean cross-entropy over every (B, T) position, as Model.loss."""
        logits = self.forward(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def load(path):
    """A model directory (config.json + model.safetensors, docs/FORMAT.md; or a Hugging Face
    Llama / DiffLlama / Motif-2 directory, read as the standard / diff_v1 model it maps onto) as a
    DiffTransformerLM (float32). The C++ loader reads and checks it (errors name the file and tensor:
    OSError, ValueError); the weights are copied into the module's parameters."""
    from .. import _core
    m = _core.load_model(str(path))
    cfg = m.config
    cfg = json.loads(cfg) if isinstance(cfg, str) else cfg
    if cfg.get("arch") == "sambay":
        raise ValueError(f"load {path}: a Phi-4-mini-flash (phi4flash, SambaY) model has no PyTorch "
                         f"module in diffattn.torch; diffattn.load_model(path) runs it (inference: "
                         f"forward, generate)")
    module = DiffTransformerLM(cfg)
    weights = m.parameters()
    with torch.no_grad():
        own = dict(module.named_parameters())
        if set(own) != set(weights):
            raise ValueError(f"load {path}: checkpoint tensors {sorted(set(weights) - set(own))} "
                             f"have no parameter, parameters {sorted(set(own) - set(weights))} "
                             f"no tensor")
        for name, p in own.items():
            p.copy_(torch.from_numpy(weights[name]))
    return module


def save(module, path):
    """Writes module (a DiffTransformerLM) as a model directory: config.json and
    model.safetensors (F32). The C++ writer checks every tensor against the config (shape,
    finite values) and replaces the directory as a whole (a kill at any moment leaves the old
    model or the new one, never a mix; the directory's other files stay). Reads back with
    load() or the C++ tools."""
    import json
    from .. import _core
    if not isinstance(module, DiffTransformerLM):
        raise TypeError(f"save: module must be a DiffTransformerLM (from diffattn.torch.load), "
                        f"got {type(module).__name__}")
    tensors = {name: p.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
               for name, p in module.named_parameters()}
    _core.save_model(str(path), json.dumps(module.config), tensors, "f32")
