"""An independent PyTorch formulation of the operator family, written from the paper's
equations (arXiv:2410.05258, Eq. 1) and the textbook's clamp step, not from diffattn's code.

Dense maps, float64, autograd for the gradients. Layouts as in docs/DESIGN.md:
q (B, Tq, 2H, D), k (B, Tk, 2G, D) or (B, Tk, G, D), v (B, Tk, G, Dv), lam (H) or (B, Tq, H).
"""

import math

import torch


def _softmax_masked(scores, mask):
    """Row softmax over the keys the mask allows; a row with none gives zeros (not NaN)."""
    neg = torch.finfo(scores.dtype).min
    s = torch.where(mask, scores, torch.full_like(scores, neg))
    m = s.max(dim=-1, keepdim=True).values.detach()
    e = torch.exp(s - m) * mask
    z = e.sum(dim=-1, keepdim=True)
    return e / torch.where(z > 0, z, torch.ones_like(z))


def _mask(Tq, Tk, causal, device=None):
    if not causal:
        return torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    i = torch.arange(Tq).unsqueeze(1)
    j = torch.arange(Tk).unsqueeze(0)
    return j <= i + (Tk - Tq)  # bottom-right, as flash-attn


def _heads(x, group):
    """(B, T, n, D) -> (B, n*group, T, D): each head repeated for the `group` heads that read it."""
    return x.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)


def diff_maps(q, k, v, causal=False, scale=None):
    """The two softmax maps, each (B, H, Tq, Tk)."""
    B, Tq, H2, D = q.shape
    H = H2 // 2
    G = v.shape[2]
    Tk = k.shape[1]
    s = 1.0 / math.sqrt(D) if scale is None else scale
    if k.shape[2] == 2 * G:
        k1, k2 = k[:, :, 0::2], k[:, :, 1::2]
    else:
        k1 = k2 = k
    q1 = q[:, :, 0::2].permute(0, 2, 1, 3)
    q2 = q[:, :, 1::2].permute(0, 2, 1, 3)
    mask = _mask(Tq, Tk, causal)
    a1 = _softmax_masked(s * q1 @ _heads(k1, H // G).transpose(-1, -2), mask)
    a2 = _softmax_masked(s * q2 @ _heads(k2, H // G).transpose(-1, -2), mask)
    return a1, a2


def diff_attention(q, k, v, lam, causal=False, scale=None, mode="signed"):
    """out (B, Tq, H, Dv) = (A1 - lam A2) V, or the clamp-and-renormalise variant."""
    H = q.shape[2] // 2
    G = v.shape[2]
    a1, a2 = diff_maps(q, k, v, causal, scale)
    if lam.dim() == 1:
        lam_b = lam.view(1, H, 1, 1)
    else:
        lam_b = lam.permute(0, 2, 1).unsqueeze(-1)  # (B, H, Tq, 1)
    w = a1 - lam_b * a2
    if mode == "clamp":
        w = torch.clamp(w, min=0.0)
        z = w.sum(dim=-1, keepdim=True)
        w = w / torch.where(z == 0, torch.ones_like(z), z)
    out = w @ _heads(v, H // G)
    return out.permute(0, 2, 1, 3)


def attention(q, k, v, causal=False, scale=None):
    """Standard softmax attention: q (B, Tq, H, D), k (B, Tk, G, D), v (B, Tk, G, Dv)."""
    B, Tq, H, D = q.shape
    G = v.shape[2]
    s = 1.0 / math.sqrt(D) if scale is None else scale
    a = _softmax_masked(
        s * q.permute(0, 2, 1, 3) @ _heads(k, H // G).transpose(-1, -2),
        _mask(Tq, k.shape[1], causal),
    )
    return (a @ _heads(v, H // G)).permute(0, 2, 1, 3)


def grads(fn, inputs, dout):
    """Gradients of sum(fn(*inputs) * dout) with respect to every input, in float64."""
    xs = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in inputs]
    out = fn(*xs)
    (out * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    return [x.grad.numpy() for x in xs]
