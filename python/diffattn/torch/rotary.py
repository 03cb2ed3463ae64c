"""Rotary position embedding as the supported checkpoints apply it: interleaved pairs (this
project's models, the upstream DIFF Transformer, Motif) and Llama's rotate-half, with
rope_scaling "linear" and "llama3" (Llama 3.1's rule)."""

import math

import torch

__all__ = ["rope_frequencies", "rotary_cos_sin", "apply_rotary_interleaved", "apply_rotary_half"]


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


def rotary_cos_sin(T, dim, theta=10000.0, offset=0, dtype=torch.float32, scaling=None,
                   device=None):
    """cos, sin (T, dim/2) for positions offset .. offset+T-1: angle t * freq_j, freq_j =
    theta^(-2j/dim) scaled by rope_scaling (rope_frequencies); angles formed in float64."""
    freq = rope_frequencies(dim, theta, scaling)
    ang = torch.arange(offset, offset + T, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(ang).to(dtype=dtype, device=device), torch.sin(ang).to(dtype=dtype, device=device)


def apply_rotary_interleaved(x, cos, sin):
    """x (B, T, n, D); pairs (2j, 2j+1) rotate by the angle of (cos, sin) (T, D/2)."""
    c = cos.to(dtype=x.dtype, device=x.device)[None, :, None, :]
    s = sin.to(dtype=x.dtype, device=x.device)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def apply_rotary_half(x, cos, sin):
    """Llama's (non-interleaved) rotation: x (B, n, T, D); cos, sin (B, T, D) or (T, D)."""
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    c = cos.unsqueeze(1).to(dtype=x.dtype, device=x.device)
    s = sin.unsqueeze(1).to(dtype=x.dtype, device=x.device)
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * c + rot * s
