"""diffattn.torch: the fused operators inside PyTorch's autograd, drop-in attention modules,
and ring (context-parallel) differential attention on torch.distributed.

    import diffattn.torch as dt
    out = dt.diff_attention(q, k, v, lam, causal=True)   # q (B, Tq, 2H, D) ...
    out.sum().backward()                                  # grads for q, k, v and lam

Layouts are those of the NumPy operators (docs/DESIGN.md, "The operator contract"):
q (B, Tq, 2H, D), k (B, Tk, 2G, D) (V1) or (B, Tk, G, D) (V2, shared keys), v (B, Tk, G, Dv),
lam (H) or (B, Tq, H); out (B, Tq, H, Dv). Standard attention: q (B, Tq, H, D), k (B, Tk, G, D).

A training step runs one forward kernel and one backward kernel: the forward saves
(out, lse, o2) and the backward hands them back to the kernel, which then recomputes nothing
that needs a Tq x Tk buffer. CPU float32 tensors reach the kernels without a copy, including
strided views such as x.transpose(1, 2) of a (B, heads, T, D) tensor (the last dimension must
be contiguous; otherwise that one tensor is copied). float64, float16 and bfloat16 inputs are
computed in float32 and the result comes back in q's dtype; gradients come back in each input's
dtype (autograd's casts).

Devices: the kernels here are the CPU ones. A tensor on another device is a ValueError naming
it; a CUDA build of the kernels (a later issue) slots in at _kernels_for().
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import _core

__all__ = [
    "diff_attention",
    "attention",
    "MultiheadDiffAttn",
    "MultiheadDiffAttnV2",
    "DiffLlamaAttention",
    "RMSNorm",
    "lambda_init_fn",
    "rotary_cos_sin",
    "apply_rotary_interleaved",
    "apply_rotary_half",
    "ring_diff_attention",
    "ring_attention",
    "zigzag_shard",
    "zigzag_unshard",
    "DiffTransformerLM",
    "load",
    "save",
]

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


# ------------------------------------------------------------------ argument checks


def _check_tensor(op, name, x, dims):
    """x must be a floating CPU tensor with one of the ranks in dims."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cpu":
        raise ValueError(f"{op}: {name} is on device {x.device}; diffattn.torch runs its kernels "
                         f"on CPU tensors only (move it with .cpu())")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{op}: {name} has dtype {x.dtype}; expected one of float32, float64, "
                        f"float16, bfloat16")
    if x.dim() not in dims:
        want = " or ".join(str(d) for d in dims)
        raise ValueError(f"{op}: {name} must have {want} dimensions, got shape {tuple(x.shape)}")


def _kernels_for(device):
    """The kernel module for a device; the CPU build is the only one so far."""
    return _core


def _as_f32(x):
    """float32 view of x: the tensor itself when it already is one (no copy)."""
    return x if x.dtype == torch.float32 else x.to(torch.float32)


def _prep(x):
    """q, k or v as the kernels take it: float32, and materialised when it repeats elements
    (a stride 0 from expand()): the kernels write each gradient in its input's layout, which
    needs distinct elements. autograd sums the gradient back over the expanded dimension."""
    x = _as_f32(x)
    if any(s == 0 for s, n in zip(x.stride(), x.shape) if n > 1):
        x = x.contiguous()
    return x


def _np(x):
    """A NumPy view of a float32 CPU tensor, sharing memory and strides when the kernels
    accept them (last dimension contiguous, strides non-negative); else a contiguous copy."""
    x = x.detach()
    if x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1:
        x = x.contiguous()
    if any(s < 0 for s in x.stride()):  # torch has none today; cheap to guard
        x = x.contiguous()
    return x.numpy()


def _np_dout(g):
    """The incoming gradient as a view the kernels accept. autograd hands out expanded
    tensors (stride 0, e.g. the gradient of out.sum()); those are materialised."""
    g = _as_f32(g)
    if any(s == 0 for s, n in zip(g.stride(), g.shape) if n > 1):
        g = g.contiguous()
    return _np(g)


def _t(a):
    return torch.from_numpy(a)


# ------------------------------------------------------------------ autograd functions


class _DiffAttentionFn(torch.autograd.Function):
    """Signed differential attention on float32 CPU tensors (see diff_attention)."""

    @staticmethod
    def forward(ctx, q, k, v, lam, causal, scale):
        K = _kernels_for(q.device)
        out, lse, o2 = K.diff_attention(_np(q), _np(k), _np(v), _np(lam.contiguous()),
                                        causal=causal, scale=scale, return_stats=True)
        out, lse, o2 = _t(out), _t(lse), _t(o2)
        ctx.causal, ctx.scale = causal, scale
        ctx.save_for_backward(q, k, v, lam, out, lse, o2)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, lam, out, lse, o2 = ctx.saved_tensors
        K = _kernels_for(q.device)
        dq, dk, dv, dlam = K.diff_attention_backward(
            _np(q), _np(k), _np(v), _np(lam.contiguous()), _np_dout(dout), causal=ctx.causal,
            scale=ctx.scale, out=out.numpy(), lse=lse.numpy(), o2=o2.numpy())
        return _t(dq), _t(dk), _t(dv), _t(dlam).view(lam.shape), None, None


class _AttentionFn(torch.autograd.Function):
    """Standard softmax attention on float32 CPU tensors (see attention)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        K = _kernels_for(q.device)
        out, lse = K.attention(_np(q), _np(k), _np(v), causal=causal, scale=scale,
                               return_stats=True)
        out, lse = _t(out), _t(lse)
        ctx.causal, ctx.scale = causal, scale
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        K = _kernels_for(q.device)
        dq, dk, dv = K.attention_backward(_np(q), _np(k), _np(v), _np_dout(dout),
                                          causal=ctx.causal, scale=ctx.scale, out=out.numpy(),
                                          lse=lse.numpy())
        return _t(dq), _t(dk), _t(dv), None, None


def _check_flags(op, causal, scale):
    if not isinstance(causal, bool):
        raise TypeError(f"{op}: causal must be a bool, got {type(causal).__name__}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"{op}: scale must be a number or None, got {type(scale).__name__}")
        scale = float(scale)
        if not math.isfinite(scale) or scale == 0.0:
            raise ValueError(f"{op}: scale must be finite and non-zero, got {scale}")
    return scale


def _check_same_dtype(op, **xs):
    dtypes = {n: x.dtype for n, x in xs.items()}
    if len(set(dtypes.values())) > 1:
        got = ", ".join(f"{n} {d}" for n, d in dtypes.items())
        raise TypeError(f"{op}: q, k and v must share one dtype, got {got}")


def diff_attention(q, k, v, lam, causal=False, scale=None):
    """Differential attention, differentiable in q, k, v and lam.

    q (B, Tq, 2H, D): pair h uses sub-heads 2h (map 1) and 2h+1 (map 2)
    k (B, Tk, 2G, D) separate keys per map (V1), or (B, Tk, G, D) shared keys (V2)
    v (B, Tk, G, Dv); lam (H) or (B, Tq, H)                   -> out (B, Tq, H, Dv)

    out = softmax(s Q1 K1^T) V - lam softmax(s Q2 K2^T) V, s = scale or 1/sqrt(D);
    causal: query i sees key j iff j <= i + Tk - Tq (bottom-right)."""
    op = "diff_attention"
    _check_tensor(op, "q", q, (4,))
    _check_tensor(op, "k", k, (4,))
    _check_tensor(op, "v", v, (4,))
    _check_tensor(op, "lam", lam, (1, 3))
    _check_same_dtype(op, q=q, k=k, v=v)
    scale = _check_flags(op, causal, scale)
    out = _DiffAttentionFn.apply(_prep(q), _prep(k), _prep(v), _as_f32(lam), causal, scale)
    return out if q.dtype == torch.float32 else out.to(q.dtype)


def attention(q, k, v, causal=False, scale=None):
    """Standard softmax attention, differentiable in q, k and v:
    q (B, Tq, H, D), k (B, Tk, G, D), v (B, Tk, G, Dv) -> out (B, Tq, H, Dv)."""
    op = "attention"
    _check_tensor(op, "q", q, (4,))
    _check_tensor(op, "k", k, (4,))
    _check_tensor(op, "v", v, (4,))
    _check_same_dtype(op, q=q, k=k, v=v)
    scale = _check_flags(op, causal, scale)
    out = _AttentionFn.apply(_prep(q), _prep(k), _prep(v), causal, scale)
    return out if q.dtype == torch.float32 else out.to(q.dtype)


# ------------------------------------------------------------------ module pieces


def lambda_init_fn(depth):
    """The paper's lambda_init schedule, depth the 0-based layer index."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) (* weight), computed in float32 and cast back
    (torch 1.13 has no nn.RMSNorm)."""

    def __init__(self, dim, eps=1e-5, elementwise_affine=True):
        super().__init__()
        self.dim, self.eps = dim, eps
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(dim))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        y = x.float()
        y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        return y * self.weight if self.weight is not None else y


def rope_frequencies(dim, theta=10000.0, scaling=None):
    """theta^(-2j/dim) for j < dim/2 (float64), scaled as a config's rope_scaling says: None or
    "default" as is; "linear" divided by factor; "llama3" (Llama 3.1's rule) divided by factor
    where the wavelength exceeds original / low_freq_factor, kept under original /
    high_freq_factor, blended linearly in original / wavelength between."""
    j = torch.arange(dim // 2, dtype=torch.float64)
    freq = theta ** (-2.0 * j / dim)
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return freq
    if kind == "linear":
        return freq / scaling["factor"]
    if kind != "llama3":
        raise ValueError(f"rope_scaling: rope type {kind!r} is not supported "
                         f"(default, linear and llama3 are)")
    f, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    L = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / freq
    s = (L / wavelen - lo) / (hi - lo)
    blended = (1 - s) * freq / f + s * freq
    out = torch.where(wavelen > L / lo, freq / f, freq)
    return torch.where((wavelen <= L / lo) & (wavelen >= L / hi), blended, out)


def rotary_cos_sin(T, dim, theta=10000.0, offset=0, dtype=torch.float32, scaling=None):
    """cos, sin (T, dim/2) for positions offset .. offset+T-1: angle t * freq_j, freq_j =
    theta^(-2j/dim) scaled by rope_scaling (rope_frequencies)."""
    freq = rope_frequencies(dim, theta, scaling)
    ang = torch.arange(offset, offset + T, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def apply_rotary_interleaved(x, cos, sin):
    """x (B, T, n, D); pairs (2j, 2j+1) rotate by the angle of (cos, sin) (T, D/2)."""
    c = cos.to(x.dtype)[None, :, None, :]
    s = sin.to(x.dtype)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def apply_rotary_half(x, cos, sin):
    """Llama's (non-interleaved) rotation: x (B, n, T, D); cos, sin (B, T, D) or (T, D)."""
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    c, s = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * c + rot * s


def _module_input(op, x, dim):
    _check_tensor(op, "x", x, (3,))
    if x.shape[-1] != dim:
        raise ValueError(f"{op}: x must have shape (B, T, {dim}), got {tuple(x.shape)}")


class MultiheadDiffAttn(nn.Module):
    """DIFF Transformer V1 attention (arXiv:2410.05258), parameter names and state_dict of the
    upstream module (microsoft/unilm Diff-Transformer multihead_diffattn.py):
    q_proj, k_proj, v_proj, out_proj (no bias), lambda_q1/k1/q2/k2 (head_dim), subln (RMSNorm
    over 2*head_dim, elementwise affine, eps 1e-5).

    num_heads is the number of differential heads (half of a Transformer's head count);
    head_dim = embed_dim / num_heads / 2; num_kv_heads (default num_heads) key/value groups.
    The upstream call MultiheadDiffAttn(args, embed_dim, depth, num_heads) works too (args'
    decoder_kv_attention_heads, if any, is num_kv_heads).
    forward(x (B, T, embed_dim), rel_pos=None, attn_mask=None) -> (B, T, embed_dim), causal
    (an explicit attn_mask is an error). rel_pos is the
    upstream (cos, sin), each (T, head_dim/2), for interleaved rotary embedding; None computes
    them for positions 0..T-1 with base rope_theta.

    Grouped keys (num_kv_heads < num_heads) follow the upstream FlashAttention file (pair h
    reads group h // (num_heads/num_kv_heads), both sub-heads); the upstream naive file
    repeats keys per sub-head instead, which differs only under GQA (docs/DESIGN.md)."""

    def __init__(self, embed_dim, depth, num_heads, num_kv_heads=None, rope_theta=10000.0):
        super().__init__()
        if not isinstance(embed_dim, int):
            # the upstream call MultiheadDiffAttn(args, embed_dim, depth, num_heads): args may
            # carry decoder_kv_attention_heads
            args = embed_dim
            embed_dim, depth, num_heads = depth, num_heads, num_kv_heads
            num_kv_heads = getattr(args, "decoder_kv_attention_heads", None)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if embed_dim % (2 * num_heads) or num_heads % num_kv_heads:
            raise ValueError(f"MultiheadDiffAttn: embed_dim {embed_dim} must divide into "
                             f"2*num_heads ({2 * num_heads}) and num_heads {num_heads} into "
                             f"num_kv_heads {num_kv_heads}")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.n_rep = num_heads // num_kv_heads
        self.head_dim = embed_dim // num_heads // 2
        self.scaling = self.head_dim ** -0.5
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim // self.n_rep, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim // self.n_rep, bias=False)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.lambda_init = lambda_init_fn(depth)
        for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, n, nn.Parameter(torch.zeros(self.head_dim).normal_(mean=0, std=0.1)))
        self.subln = RMSNorm(2 * self.head_dim, eps=1e-5, elementwise_affine=True)

    def lambda_full(self):
        l1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1).float())
        l2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1).float())
        return l1 - l2 + self.lambda_init

    def forward(self, x, rel_pos=None, attn_mask=None):
        _module_input("MultiheadDiffAttn", x, self.embed_dim)
        if attn_mask is not None:
            raise ValueError("MultiheadDiffAttn: attn_mask is not supported (the attention is "
                             "causal, as upstream's default mask); pass None")
        B, T, _ = x.shape
        H, G, D = self.num_heads, self.num_kv_heads, self.head_dim
        cos, sin = rel_pos if rel_pos is not None else rotary_cos_sin(T, D, self.rope_theta)
        q = apply_rotary_interleaved(self.q_proj(x).view(B, T, 2 * H, D), cos, sin)
        k = apply_rotary_interleaved(self.k_proj(x).view(B, T, 2 * G, D), cos, sin)
        v = self.v_proj(x).view(B, T, G, 2 * D)
        lam = self.lambda_full().expand(H)  # (H)
        o = diff_attention(q, k, v, lam, causal=True, scale=self.scaling)  # (B, T, H, 2D)
        o = self.subln(o) * (1 - self.lambda_init)
        return self.out_proj(o.reshape(B, T, H * 2 * D))


class MultiheadDiffAttnV2(nn.Module):
    """DIFF Transformer V2 attention: q_proj gives 2*num_heads query heads (pair h: sub-heads
    2h and 2h+1), k_proj and v_proj num_kv_heads heads shared by both maps, lambda_proj a
    per-token, per-head lambda = sigmoid(lambda_proj x), o_proj; no per-head norm (no bias
    anywhere). forward(x (B, T, embed_dim), rel_pos=None) -> (B, T, embed_dim), causal, with
    interleaved rotary embedding on q and k (rel_pos as for MultiheadDiffAttn).
    head_dim defaults to embed_dim / num_heads."""

    def __init__(self, embed_dim, num_heads, num_kv_heads=None, head_dim=None,
                 rope_theta=10000.0):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        head_dim = embed_dim // num_heads if head_dim is None else head_dim
        if num_heads % num_kv_heads or head_dim <= 0:
            raise ValueError(f"MultiheadDiffAttnV2: num_heads {num_heads} must be a multiple of "
                             f"num_kv_heads {num_kv_heads}, head_dim {head_dim} positive")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim, self.rope_theta = head_dim, rope_theta
        self.q_proj = nn.Linear(embed_dim, 2 * num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, embed_dim, bias=False)
        self.lambda_proj = nn.Linear(embed_dim, num_heads, bias=False)

    def forward(self, x, rel_pos=None):
        _module_input("MultiheadDiffAttnV2", x, self.embed_dim)
        B, T, _ = x.shape
        H, G, D = self.num_heads, self.num_kv_heads, self.head_dim
        cos, sin = rel_pos if rel_pos is not None else rotary_cos_sin(T, D, self.rope_theta)
        q = apply_rotary_interleaved(self.q_proj(x).view(B, T, 2 * H, D), cos, sin)
        k = apply_rotary_interleaved(self.k_proj(x).view(B, T, G, D), cos, sin)
        v = self.v_proj(x).view(B, T, G, D)
        lam = torch.sigmoid(self.lambda_proj(x))  # (B, T, H)
        o = diff_attention(q, k, v, lam, causal=True)  # (B, T, H, D)
        return self.o_proj(o.reshape(B, T, H * D))


def _cfg(config, name, default=None):
    if isinstance(config, dict):
        return config.get(name, default)
    v = getattr(config, name, default)
    return default if v is None else v


class DiffLlamaAttention(nn.Module):
    """transformers' DiffLlama attention ("halves" layout), same parameter names and
    state_dict: q_proj, k_proj, v_proj, o_proj (bias = config.attention_bias), lambda_q1/k1/
    q2/k2 (head_dim), groupnorm (RMSNorm over 2*head_dim without weight, eps
    config.rms_norm_eps), lambda_init = 0.8 - 0.6 exp(-0.3 layer_idx).

    config: an object or dict with hidden_size, num_attention_heads, num_key_value_heads,
    head_dim (default hidden_size / num_attention_heads), rms_norm_eps, attention_bias,
    lambda_std_dev, rope_theta. forward(hidden_states (B, T, hidden), position_embeddings=None,
    attention_mask=None, past_key_values=None) -> (attn_output, None) as transformers'
    attention returns it without weights. position_embeddings is Llama's (cos, sin), each
    (B, T, head_dim) or (T, head_dim), rotate-half style; None computes them for positions
    0..T-1 with rope_theta. Attention is causal (bottom-right when a cache holds earlier keys).
    attention_mask marks padding: a (B, Tk) 0/1 mask (1: a real token) or transformers' 4-D
    (B, 1, T, Tk) mask (additive: 0 where allowed; or bool: True where allowed) that is causal
    apart from padded keys; each sequence then runs on its real tokens alone (padded query rows
    give zeros), and any other mask pattern is an error. past_key_values: a cache with
    transformers' update(key, value, layer_idx, cache_kwargs) -> (keys, values), keys and values
    (B, num_key_value_heads, T, head_dim) after RoPE, as DynamicCache keeps them.

    The layout as transformers writes it: the first half of the query heads is map 1, the
    second half map 2 (pair p: query heads p and p + N/2); after repeat_kv the value heads are
    split into halves and concatenated on the feature axis, so pair p's values are
    cat(v[p], v[p + N/2]) (2*head_dim) and its output is A1 V - lambda A2 V. Here that is one
    V1 call: q interleaved (B, T, 2P, D), keys (B, T, 2G', D), values (B, T, G', 2D) with
    G' = num_key_value_heads / 2 groups (an even count), or the repeated heads otherwise."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.hidden_size = _cfg(config, "hidden_size")
        self.num_heads = _cfg(config, "num_attention_heads")
        self.num_key_value_heads = _cfg(config, "num_key_value_heads", self.num_heads)
        self.head_dim = _cfg(config, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % 2 or self.num_heads % self.num_key_value_heads:
            raise ValueError(f"DiffLlamaAttention: num_attention_heads {self.num_heads} must be "
                             f"even and a multiple of num_key_value_heads "
                             f"{self.num_key_value_heads}")
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.rope_theta = _cfg(config, "rope_theta", 10000.0)
        self.layer_idx = layer_idx
        bias = bool(_cfg(config, "attention_bias", False))
        std = _cfg(config, "lambda_std_dev", 0.1)
        C, N, NKV, D = self.hidden_size, self.num_heads, self.num_key_value_heads, self.head_dim
        self.q_proj = nn.Linear(C, N * D, bias=bias)
        self.k_proj = nn.Linear(C, NKV * D, bias=bias)
        self.v_proj = nn.Linear(C, NKV * D, bias=bias)
        self.o_proj = nn.Linear(N * D, C, bias=bias)
        self.lambda_init = lambda_init_fn(layer_idx)
        for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, n, nn.Parameter(torch.normal(0, std, size=(D,))))
        self.groupnorm = RMSNorm(2 * D, eps=_cfg(config, "rms_norm_eps", 1e-6),
                                 elementwise_affine=False)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None,
                past_key_values=None, **kwargs):
        op = "DiffLlamaAttention"
        _module_input(op, hidden_states, self.hidden_size)
        past_key_values = past_key_values if past_key_values is not None else kwargs.get("past_key_value")
        x = hidden_states
        B, T, _ = x.shape
        N, NKV, D = self.num_heads, self.num_key_value_heads, self.head_dim
        P = N // 2
        if position_embeddings is None:
            c, s = rotary_cos_sin(T, D, self.rope_theta)
            position_embeddings = (torch.cat((c, c), -1), torch.cat((s, s), -1))
        cos, sin = position_embeddings
        q = apply_rotary_half(self.q_proj(x).view(B, T, N, D).transpose(1, 2), cos, sin)
        k = apply_rotary_half(self.k_proj(x).view(B, T, NKV, D).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(B, T, NKV, D)
        if past_key_values is not None:
            if not hasattr(past_key_values, "update"):
                raise TypeError(f"{op}: past_key_values must be a cache with update(key, value, "
                                f"layer_idx, cache_kwargs), got {type(past_key_values).__name__}")
            k, vt = past_key_values.update(k, v.transpose(1, 2), self.layer_idx,
                                           {"sin": sin, "cos": cos})
            v = vt.transpose(1, 2)
        q = q.transpose(1, 2)  # (B, T, N, D)
        k = k.transpose(1, 2)  # (B, Tk, NKV, D)
        if NKV % 2:  # no clean grouping: repeat to one key/value head per query head
            k = k.repeat_interleave(self.num_key_value_groups, dim=2)
            v = v.repeat_interleave(self.num_key_value_groups, dim=2)
            NKV = N
        Gp = NKV // 2
        # pair p: sub-head 2p = query head p, 2p+1 = query head p + P
        qi = torch.stack((q[:, :, :P], q[:, :, P:]), dim=3).reshape(B, T, 2 * P, D)
        # group g: key sub-heads 2g = head g, 2g+1 = head g + NKV/2; values cat(v[g], v[g+NKV/2])
        ki = torch.stack((k[:, :, :Gp], k[:, :, Gp:]), dim=3).reshape(B, k.shape[1], 2 * Gp, D)
        vi = torch.cat((v[:, :, :Gp], v[:, :, Gp:]), dim=-1)  # (B, T, Gp, 2D)
        l1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1, dtype=torch.float32))
        l2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1, dtype=torch.float32))
        lam = (l1 - l2 + self.lambda_init).expand(P)
        scale = 1.0 / math.sqrt(D)
        if attention_mask is None:
            o = diff_attention(qi, ki, vi, lam, causal=True, scale=scale)  # (B, T, P, 2D)
        else:
            keep = _padding_of(op, attention_mask, B, T, ki.shape[1])
            o = _per_sequence(qi, ki, vi, keep, lambda a, b, c: diff_attention(
                a, b, c, lam, causal=True, scale=scale), P)
        o = (1 - self.lambda_init) * self.groupnorm(o)
        return self.o_proj(o.reshape(B, T, P * 2 * D)), None


def _padding_of(op, mask, B, T, Tk):
    """The real keys (B, Tk) bool of a padding mask, checked to be causal apart from them."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{op}: attention_mask must be a torch.Tensor, got {type(mask).__name__}")
    causal = torch.ones(T, Tk, dtype=torch.bool).tril(Tk - T)
    if mask.dim() == 2:
        if tuple(mask.shape) != (B, Tk):
            raise ValueError(f"{op}: a 2-D attention_mask must be (B, Tk) = ({B}, {Tk}), got "
                             f"{tuple(mask.shape)}")
        return mask != 0
    if mask.dim() != 4 or tuple(mask.shape) != (B, 1, T, Tk):
        raise ValueError(f"{op}: attention_mask must be (B, Tk) or (B, 1, T, Tk) = ({B}, 1, {T}, "
                         f"{Tk}), got {tuple(mask.shape)}")
    allowed = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
    keep = allowed[:, -1, :].clone()  # the last query row sees every real key
    keep[:, Tk - T:] |= allowed.diagonal(Tk - T, dim1=1, dim2=2)  # each real query sees itself
    want = causal[None] & keep[:, None, :]
    rows = keep[:, Tk - T:]  # real query rows
    if not bool(((allowed == want) | ~rows[:, :, None]).all()):
        raise ValueError(f"{op}: attention_mask is not a causal mask with padded keys; other "
                         f"patterns are not supported (the operator masks causally)")
    return keep


def _per_sequence(q, k, v, keep, fn, heads):
    """fn on each sequence's real tokens alone (q (B, T, ...), k/v (B, Tk, ...), keep (B, Tk)):
    the outputs (B, T, heads, Dv) of its real query rows, zeros for the padded ones. A sequence's real queries must
    be its last real tokens (left padding, or padding before the new tokens), so that causal
    attention on the packed sequence is the padded one's."""
    B, T, Tk = q.shape[0], q.shape[1], k.shape[1]
    outs = []
    for b in range(B):
        kk = keep[b].nonzero().flatten()
        qk = keep[b, Tk - T:].nonzero().flatten()
        out = q.new_zeros((T, heads, v.shape[-1]))
        if len(qk):
            # packed causal = padded causal: real query t (of T) sees the real keys up to Tk - T + t
            seen = torch.cumsum(keep[b].long(), 0)[Tk - T + qk]
            if not bool((seen == len(kk) - len(qk) + 1 + torch.arange(len(qk))).all()):
                raise ValueError("attention_mask: a padded position lies between the new real "
                                 "tokens; pad on the left (or before the new tokens)")
            o = fn(q[b:b + 1, qk], k[b:b + 1, kk], v[b:b + 1, kk])[0]
            out = out.index_copy(0, qk, o)
        outs.append(out)
    return torch.stack(outs)


# ------------------------------------------------------------------ ring attention
#
# Context parallelism for differential attention on torch.distributed. The sequence is cut
# into 2W chunks of c = T / (2W) tokens (W ranks); each rank holds two chunks, concatenated:
#
#   layout "zigzag" (default): rank r holds chunks r and 2W-1-r. Under a causal mask every
#     rank then has the same work at every ring step: its own block costs two diagonal
#     c x c tiles and one full one, every other block exactly two full c x c tiles (the
#     early chunk sees all of a block from an earlier rank, the late chunk all of it from a
#     later rank). zigzag_shard / zigzag_unshard cut and reassemble a full tensor.
#   layout "contiguous": rank r holds tokens [r T/W, (r+1) T/W) (chunks 2r, 2r+1). Under a
#     causal mask rank W-1 does W times the work of rank 0: fine without a mask.
#
# Forward: K/V shards travel the ring (rank r sends to r+1, receives from r-1; the next
# block's transfer overlaps the current block's kernels). For each (query chunk, key chunk)
# pair the mask leaves visible (none, all, or the causal diagonal) one fused call with
# lambda = 0 returns map 1's output as out, map 2's as o2, and each map's log-sum-exp; every
# map keeps its own running (output, lse), merged with log-sum-exp weights in float64, and the
# subtraction out = O1 - lam O2 comes after the last merge.
# Backward: the global (out, lse, o2) of the rank's rows make every block's contribution exact
# (P = exp(s q.k - lse) with the global lse, dS = P (dP - D), D from the global outputs), so
# each block's kernel backward gives its share of dq, dk, dv. K/V travel the ring again with
# their dK/dV accumulators; after W steps each rank's dK/dV come home. dlam = -dout . o2 needs
# no keys: computed once from the saved o2.
#
# Bytes sent per rank per step (float32): forward (W-1) (|K| + |V|), backward
# (W-1) (|K| + |V|) + W (|K| + |V|) (nothing at all when W = 1), |K| and |V| this rank's
# shard sizes. Counted in
# ring_bytes_sent (a dict: "forward", "backward").

ring_bytes_sent = {"forward": 0, "backward": 0}


def _chunk_ids(rank, world, layout):
    return (rank, 2 * world - 1 - rank) if layout == "zigzag" else (2 * rank, 2 * rank + 1)


def zigzag_shard(x, rank, world, dim=1):
    """Rank `rank`'s zig-zag shard of a full-sequence tensor: chunks rank and 2W-1-rank of
    x's dimension `dim` cut into 2*world equal chunks, concatenated."""
    T = x.shape[dim]
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"zigzag_shard: rank {rank} is not in [0, world={world})")
    if T % (2 * world):
        raise ValueError(f"zigzag_shard: sequence length {T} (dimension {dim}) is not divisible "
                         f"by 2*world = {2 * world}")
    c = T // (2 * world)
    a, b = _chunk_ids(rank, world, "zigzag")
    return torch.cat((x.narrow(dim, a * c, c), x.narrow(dim, b * c, c)), dim)


def zigzag_unshard(shards, dim=1):
    """The full-sequence tensor from every rank's zig-zag shard (rank order)."""
    W = len(shards)
    chunks = [None] * (2 * W)
    for r, s in enumerate(shards):
        a, b = _chunk_ids(r, W, "zigzag")
        chunks[a], chunks[b] = torch.chunk(s, 2, dim)
    return torch.cat(chunks, dim)


def _visible(qi, kj, causal):
    """None: query chunk qi sees nothing of key chunk kj; False: all of it; True: the causal
    diagonal (same chunk)."""
    if not causal:
        return False
    if kj < qi:
        return False
    return True if kj == qi else None


class _Ring:
    """Ranks and point-to-point transfers of one group."""

    def __init__(self, group):
        import torch.distributed as dist
        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)

        def glob(r):
            if group is None:
                return r
            g = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
            return g(group, r)

        self.next = glob((self.rank + 1) % self.world)
        self.prev = glob((self.rank - 1) % self.world)

    def start(self, tensors, phase):
        """Send tensors to the next rank and receive same-shaped ones from the previous."""
        bufs = [torch.empty_like(t) for t in tensors]
        reqs = [self.dist.isend(t, self.next, group=self.group) for t in tensors]
        reqs += [self.dist.irecv(b, self.prev, group=self.group) for b in bufs]
        ring_bytes_sent[phase] += sum(t.numel() * t.element_size() for t in tensors)
        return reqs, bufs

    @staticmethod
    def finish(pending):
        reqs, bufs = pending
        for r in reqs:
            r.wait()
        return bufs


def _merge(O, L, rows, o_part, l_part, m, maps=2):
    """Fold one block's partial (o_part (B, c, H, Dv), l_part (B, maps*H, c), map m's rows
    m, m+maps, ...) into the running map-m output O (B, Tl, H, Dv) and lse L (B, maps*H, Tl),
    float64."""
    lp = l_part[:, m::maps].double()  # (B, H, c)
    lp = torch.where(lp == float("inf"), torch.full_like(lp, float("-inf")), lp)  # no key
    lo = L[:, m::maps, rows]
    new = torch.logaddexp(lo, lp)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    w_old = torch.exp(lo - safe).transpose(1, 2).unsqueeze(-1)  # (B, c, H, 1)
    w_new = torch.exp(lp - safe).transpose(1, 2).unsqueeze(-1)
    O[:, rows] = O[:, rows] * w_old + o_part.double() * w_new
    L[:, m::maps, rows] = new


def _ring_forward(ring, layout, causal, q, k, v, block):
    """Runs block(a, k_chunk, v_chunk, mode) for every (query chunk a, key chunk) pair this
    rank's queries see, while the K/V shards travel the ring (the next shard's transfer overlaps
    this shard's work)."""
    W, r = ring.world, ring.rank
    c = q.shape[1] // 2
    mine = _chunk_ids(r, W, layout)
    kb, vb = k.contiguous(), v.contiguous()
    for s in range(W):
        pending = ring.start([kb, vb], "forward") if s < W - 1 else None
        theirs = _chunk_ids((r - s) % W, W, layout)
        for a in range(2):
            for b in range(2):
                mode = _visible(mine[a], theirs[b], causal)
                if mode is not None:
                    block(a, kb[:, b * c:(b + 1) * c], vb[:, b * c:(b + 1) * c], mode)
        if pending is not None:
            kb, vb = ring.finish(pending)


def _ring_backward(ring, layout, causal, q, k, v, block):
    """dq, dk, dv over the ring: block(a, k_chunk, v_chunk, mode) returns the (dq, dk, dv) of
    query chunk a against one key chunk; each shard's dK/dV travel with it, so after W hops
    they are home."""
    W, r = ring.world, ring.rank
    c = q.shape[1] // 2
    mine = _chunk_ids(r, W, layout)
    dq = torch.zeros(q.shape, dtype=torch.float64)
    kb, vb = k.contiguous(), v.contiguous()
    dkb, dvb = torch.zeros_like(kb), torch.zeros_like(vb)
    for s in range(W):
        pending = ring.start([kb, vb], "backward") if s < W - 1 else None
        theirs = _chunk_ids((r - s) % W, W, layout)
        for a in range(2):
            for b in range(2):
                mode = _visible(mine[a], theirs[b], causal)
                if mode is None:
                    continue
                cols = slice(b * c, (b + 1) * c)
                gq, gk, gv = block(a, kb[:, cols], vb[:, cols], mode)
                dq[:, a * c:(a + 1) * c] += gq
                dkb[:, cols] += gk
                dvb[:, cols] += gv
        dkb, dvb = ring.finish(ring.start([dkb, dvb], "backward")) if W > 1 else [dkb, dvb]
        if pending is not None:
            kb, vb = ring.finish(pending)
    return dq, dkb, dvb


def _row_pieces(c, **tensors):
    """Per query chunk (2 of c rows): the contiguous NumPy pieces the kernels read. A tensor
    whose rows are its second dimension is cut there; lse (B, heads, T) on its last."""
    out = []
    for a in range(2):
        rows = slice(a * c, (a + 1) * c)
        out.append({n: _np((t[:, :, rows] if n == "lse" else t[:, rows]).contiguous())
                    for n, t in tensors.items()})
    return out


def _lse_of(L):
    """The merged log-sum-exp as the kernels save it: +inf for a row that saw no key."""
    return torch.where(torch.isinf(L), torch.full_like(L, float("inf")), L).float()


class _RingAttnFn(torch.autograd.Function):
    """Standard attention over the ring: as _RingDiffFn with one map."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, group, layout):
        ring = _Ring(group)
        B, Tl, H, D = q.shape
        c = Tl // 2
        O = torch.zeros(B, Tl, H, v.shape[-1], dtype=torch.float64)
        L = torch.full((B, H, Tl), float("-inf"), dtype=torch.float64)

        def block(a, kc, vc, mode):
            rows = slice(a * c, (a + 1) * c)
            op, lp = _core.attention(_np(q[:, rows]), _np(kc), _np(vc), causal=mode, scale=scale,
                                     backend="fused", return_stats=True)
            _merge(O, L, rows, _t(op), _t(lp), 0, maps=1)

        _ring_forward(ring, layout, causal, q, k, v, block)
        out = O.float()
        ctx.causal, ctx.scale, ctx.group, ctx.layout = causal, scale, group, layout
        ctx.save_for_backward(q, k, v, out, _lse_of(L))
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dout = _as_f32(dout).contiguous()
        per_row = _row_pieces(q.shape[1] // 2, q=q, dout=dout, out=out, lse=lse)

        def block(a, kc, vc, mode):
            x = per_row[a]
            gq, gk, gv = _core.attention_backward(
                x["q"], _np(kc), _np(vc), x["dout"], causal=mode, scale=ctx.scale,
                backend="fused", out=x["out"], lse=x["lse"])
            return _t(gq), _t(gk), _t(gv)

        dq, dk, dv = _ring_backward(_Ring(ctx.group), ctx.layout, ctx.causal, q, k, v, block)
        return dq.float(), dk, dv, None, None, None, None


class _RingDiffFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lam, causal, scale, group, layout):
        ring = _Ring(group)
        B, Tl, H2, D = q.shape
        H, c = H2 // 2, Tl // 2
        zero_lam = _np(torch.zeros(H))
        O1 = torch.zeros(B, Tl, H, v.shape[-1], dtype=torch.float64)
        O2 = torch.zeros_like(O1)
        L = torch.full((B, H2, Tl), float("-inf"), dtype=torch.float64)

        def block(a, kc, vc, mode):
            # lambda 0: out is map 1's output, o2 map 2's; each merges with its own lse
            rows = slice(a * c, (a + 1) * c)
            o1p, lp, o2p = _core.diff_attention(_np(q[:, rows]), _np(kc), _np(vc), zero_lam,
                                                causal=mode, scale=scale, backend="fused",
                                                return_stats=True)
            lp = _t(lp)
            _merge(O1, L, rows, _t(o1p), lp, 0)
            _merge(O2, L, rows, _t(o2p), lp, 1)

        _ring_forward(ring, layout, causal, q, k, v, block)
        lam_b = lam.double().view(1, 1, H, 1) if lam.dim() == 1 else lam.double().unsqueeze(-1)
        out = (O1 - lam_b * O2).float()
        o2 = O2.float()
        ctx.causal, ctx.scale, ctx.group, ctx.layout = causal, scale, group, layout
        ctx.save_for_backward(q, k, v, lam, out, _lse_of(L), o2)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, lam, out, lse, o2 = ctx.saved_tensors
        c = q.shape[1] // 2
        dout = _as_f32(dout).contiguous()
        per_row = _row_pieces(c, q=q, dout=dout, out=out, o2=o2, lse=lse)
        for a in range(2):
            per_row[a]["lam"] = _np(lam.contiguous() if lam.dim() == 1
                                    else lam[:, a * c:(a + 1) * c].contiguous())

        def block(a, kc, vc, mode):
            x = per_row[a]
            gq, gk, gv, _ = _core.diff_attention_backward(
                x["q"], _np(kc), _np(vc), x["lam"], x["dout"], causal=mode, scale=ctx.scale,
                backend="fused", out=x["out"], lse=x["lse"], o2=x["o2"])
            return _t(gq), _t(gk), _t(gv)

        dq, dk, dv = _ring_backward(_Ring(ctx.group), ctx.layout, ctx.causal, q, k, v, block)
        dlam = -(dout.double() * o2.double()).sum(-1)  # (B, Tl, H), computed once, not per block
        if lam.dim() == 1:
            dlam = dlam.sum((0, 1))
        return (dq.float(), dk, dv, dlam.float(), None, None, None, None)


def ring_diff_attention(q, k, v, lam, causal=True, group=None, scale=None, layout="zigzag"):
    """Differential attention over a sequence sharded across the ranks of `group` (default:
    the whole world), differentiable in q, k, v and lam.

    Each rank passes its shard: q (B, Tl, 2H, D), k (B, Tl, 2G or G, D), v (B, Tl, G, Dv),
    lam (H) or (B, Tl, H) (this rank's rows), Tl = T / W the same on every rank and even.
    layout "zigzag" (default): rank r holds chunks r and 2W-1-r of the sequence cut into 2W
    (zigzag_shard builds it; balances a causal mask); "contiguous": tokens [r Tl, (r+1) Tl).
    Returns this rank's rows of the single-process diff_attention output, (B, Tl, H, Dv).

    The gradients of q, k and v are this rank's rows of the full ones (dK/dV of every rank's
    queries travel back along the ring). A lambda of shape (H) is shared by every rank, as a
    replicated parameter is: each rank's gradient is its own rows' share, and their sum (an
    all_reduce, as DistributedDataParallel does for parameters) is the single-process one.
    """
    op = "ring_diff_attention"
    _check_tensor(op, "lam", lam, (1, 3))
    scale = _check_ring(op, q, k, v, causal, group, scale, layout)
    out = _RingDiffFn.apply(_as_f32(q), _as_f32(k), _as_f32(v), _as_f32(lam), causal, scale,
                            group, layout)
    return out if q.dtype == torch.float32 else out.to(q.dtype)


def ring_attention(q, k, v, causal=True, group=None, scale=None, layout="zigzag"):
    """Standard softmax attention over a sequence sharded across the ranks of `group`, as
    ring_diff_attention with one map: q (B, Tl, H, D), k (B, Tl, G, D), v (B, Tl, G, Dv)
    this rank's rows -> this rank's rows of the output (B, Tl, H, Dv)."""
    op = "ring_attention"
    scale = _check_ring(op, q, k, v, causal, group, scale, layout)
    out = _RingAttnFn.apply(_as_f32(q), _as_f32(k), _as_f32(v), causal, scale, group, layout)
    return out if q.dtype == torch.float32 else out.to(q.dtype)


def _check_ring(op, q, k, v, causal, group, scale, layout):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{op}: torch.distributed is not initialized "
                           f"(call torch.distributed.init_process_group first)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(op, name, x, (4,))
    _check_same_dtype(op, q=q, k=k, v=v)
    scale = _check_flags(op, causal, scale)
    if layout not in ("zigzag", "contiguous"):
        raise ValueError(f"{op}: layout must be 'zigzag' or 'contiguous', got {layout!r}")
    W = dist.get_world_size(group)
    Tl = q.shape[1]
    # every rank must hold the same number of rows: compare (Tl, -Tl) maxima over the group
    t = torch.tensor([Tl, -Tl], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    if int(t[0]) != -int(t[1]):
        raise ValueError(f"{op}: the ranks hold different numbers of rows ({Tl} here, between "
                         f"{-int(t[1])} and {int(t[0])}); every rank needs T / world rows")
    if Tl % 2:
        raise ValueError(f"{op}: sequence length T = {Tl * W} is not divisible by 2*world = "
                         f"{2 * W} (each rank holds two chunks of T / (2*world) rows; this "
                         f"rank has {Tl})")
    for name, x in (("k", k), ("v", v)):
        if x.shape[1] != Tl:
            raise ValueError(f"{op}: {name} has {x.shape[1]} rows on this rank, q has {Tl}")
    return scale


# ------------------------------------------------------------------ whole models


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
            self.lambda_init = lambda_init_fn(layer) if li is None else li
            for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                setattr(self, n, nn.Parameter(torch.zeros(D)))
            self.subln = RMSNorm(2 * D, eps=cfg["norm_eps"])
        elif self.kind == "diff_v2":
            self.lambda_proj = nn.Linear(C, H, bias=False)

    def forward(self, x):  # x (B, T, C), normalised
        B, T, _ = x.shape
        H, G, D = self.H, self.G, self.D
        cos, sin = rotary_cos_sin(T, D, self.theta, scaling=self.scaling)
        q = apply_rotary_interleaved(self.q_proj(x).view(B, T, -1, D), cos, sin)
        k = apply_rotary_interleaved(self.k_proj(x).view(B, T, -1, D), cos, sin)
        v = self.v_proj(x).view(B, T, G, self.Dv)
        if self.kind == "standard":
            o = attention(q, k, v, causal=True)
        elif self.kind == "diff_v1":
            lam = (torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
                   - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2)) + self.lambda_init)
            o = diff_attention(q, k, v, lam.expand(H), causal=True)
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


class _Layer(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        C, eps = cfg["d_model"], cfg["norm_eps"]
        self.attn_norm = RMSNorm(C, eps)
        self.attn = _ModelAttention(cfg, layer)
        self.ffn_norm = RMSNorm(C, eps)
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
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= V):
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
    Llama / DiffLlama directory, read as the standard / diff_v1 model it maps onto) as a
    DiffTransformerLM (float32). The C++ loader reads and checks it (errors name the file and tensor:
    OSError, ValueError); the weights are copied into the module's parameters."""
    import json
    m = _core.load_model(str(path))
    module = DiffTransformerLM(json.loads(m.config))
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
    model.safetensors (F32, tensors in name order). Reads back with load() or the C++ tools."""
    import json
    import os
    import struct
    if not isinstance(module, DiffTransformerLM):
        raise TypeError(f"save: module must be a DiffTransformerLM (from diffattn.torch.load), "
                        f"got {type(module).__name__}")
    os.makedirs(path, exist_ok=True)
    header, blobs, off = {}, [], 0
    for name, p in sorted(module.named_parameters()):
        raw = p.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(p.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = os.path.join(path, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(module.config, f, indent=2)
