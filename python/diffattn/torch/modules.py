"""Drop-in attention modules with the parameter names and state_dict of their upstream
counterparts, running the fused operators: MultiheadDiffAttn (the DIFF Transformer's V1
module, microsoft/unilm), MultiheadDiffAttnV2, DiffLlamaAttention (transformers' DiffLlama),
and the RMSNorm they use."""

import math

import torch
import torch.nn as nn

from ._checks import check_non_negative_int, check_positive_int, check_tensor
from .ops import diff_attention
from .rotary import apply_rotary_half, apply_rotary_interleaved, rotary_cos_sin

__all__ = ["lambda_init_fn", "RMSNorm", "MultiheadDiffAttn", "MultiheadDiffAttnV2",
           "DiffLlamaAttention"]


def lambda_init_fn(depth):
    """The paper's lambda_init schedule, depth the 0-based layer index (arXiv:2410.05258,
    Section 2.1: lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)) for the 1-based layer l)."""
    check_non_negative_int("lambda_init_fn", "depth", depth)
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) (* weight), computed in float32 and cast back (the upstream
    modules' RMSNorm; its state_dict is theirs)."""

    def __init__(self, dim, eps=1e-5, elementwise_affine=True):
        super().__init__()
        check_positive_int("RMSNorm", "dim", dim)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"RMSNorm: eps must be a positive number, got {eps!r}")
        self.dim, self.eps = dim, eps
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(dim))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        y = x.float()
        y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        return y * self.weight if self.weight is not None else y


def _module_input(op, x, dim):
    check_tensor(op, "x", x, (3,))
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
        op = "MultiheadDiffAttn"
        check_positive_int(op, "embed_dim", embed_dim)
        check_non_negative_int(op, "depth", depth)
        check_positive_int(op, "num_heads", num_heads)
        check_positive_int(op, "num_kv_heads", num_kv_heads)
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
        cos, sin = rel_pos if rel_pos is not None else rotary_cos_sin(T, D, self.rope_theta,
                                                                      device=x.device)
        q = apply_rotary_interleaved(self.q_proj(x).view(B, T, 2 * H, D), cos, sin)
        k = apply_rotary_interleaved(self.k_proj(x).view(B, T, 2 * G, D), cos, sin)
        v = self.v_proj(x).view(B, T, G, 2 * D)
        lam = self.lambda_full().reshape(1)  # one lambda for every pair (dlam: one sum)
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
        op = "MultiheadDiffAttnV2"
        check_positive_int(op, "embed_dim", embed_dim)
        check_positive_int(op, "num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_positive_int(op, "num_kv_heads", num_kv_heads)
        head_dim = embed_dim // num_heads if head_dim is None else head_dim
        check_positive_int(op, "head_dim", head_dim)
        if num_heads % num_kv_heads:
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
        cos, sin = rel_pos if rel_pos is not None else rotary_cos_sin(T, D, self.rope_theta,
                                                                      device=x.device)
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
        op = "DiffLlamaAttention"
        self.hidden_size = check_positive_int(op, "hidden_size", _cfg(config, "hidden_size"))
        self.num_heads = check_positive_int(op, "num_attention_heads",
                                            _cfg(config, "num_attention_heads"))
        self.num_key_value_heads = check_positive_int(
            op, "num_key_value_heads", _cfg(config, "num_key_value_heads", self.num_heads))
        self.head_dim = check_positive_int(
            op, "head_dim", _cfg(config, "head_dim", self.hidden_size // self.num_heads))
        check_non_negative_int(op, "layer_idx", layer_idx)
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
                past_key_values=None, cache=None, **kwargs):
        op = "DiffLlamaAttention"
        _module_input(op, hidden_states, self.hidden_size)
        # transformers 5 names the cache `cache` (earlier: past_key_values, past_key_value)
        for alt in (cache, kwargs.get("past_key_value")):
            past_key_values = past_key_values if past_key_values is not None else alt
        x = hidden_states
        B, T, _ = x.shape
        N, NKV, D = self.num_heads, self.num_key_value_heads, self.head_dim
        P = N // 2
        if position_embeddings is None:
            c, s = rotary_cos_sin(T, D, self.rope_theta, device=x.device)
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
        lam = (l1 - l2 + self.lambda_init).reshape(1)  # one lambda for every pair
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
    causal = torch.ones(T, Tk, dtype=torch.bool, device=mask.device).tril(Tk - T)
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
            if not bool((seen == len(kk) - len(qk) + 1 + torch.arange(len(qk), device=seen.device)).all()):
                raise ValueError("attention_mask: a padded position lies between the new real "
                                 "tokens; pad on the left (or before the new tokens)")
            o = fn(q[b:b + 1, qk], k[b:b + 1, kk], v[b:b + 1, kk])[0]
            out = out.index_copy(0, qk, o)
        outs.append(out)
    return torch.stack(outs)
