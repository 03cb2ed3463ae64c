#!/usr/bin/env python3
"""Cross-checks tests/python/phi4flash_reference.py against the published Phi-4-mini-flash-reasoning
modeling file, on CPU in float64. The published files are not in this repository: pass the
directory holding modeling_phi4flash.py and configuration_phi4flash.py (from the model's Hugging
Face repository) as --published; einops must be importable (pip install einops).

    python scripts/phi4flash_crosscheck.py --published /tmp/phi4src

The file needs CUDA-only packages; they are replaced by pure-PyTorch stand-ins written here:
  flash_attn.flash_attn_func / flash_attn_varlen_func: explicit softmax attention with
    flash-attn's documented semantics (GQA by contiguous groups, causal aligned bottom-right,
    window_size (left, right): query i sees keys [i + sk - sq - left, i + sk - sq + right]);
  flash_attn.bert_padding: index_first_axis, pad_input, unpad_input;
  selective_scan_cuda.fwd: a sequential selective scan, returning (out, x, out_z) in the kernel's
    layout (x[..., 1::2] of the last chunk is the last state);
  mamba_ssm's selective_state_update: the one-token scan update with the kernel's arguments
    (z=None: no gate), the path the file takes whenever mamba_ssm is installed (--fallback-ssm
    runs the file's own einsum fallback instead, which gates the memory layer twice);
  causal_conv1d_fn / causal_conv1d_update = None: the file's own slow paths (nn.Conv1d over the
    sequence, the roll-and-sum conv step);
  torch.cuda.jiterator: the swiglu kernel as x * y * sigmoid(x).
The file's two asserts that attention inputs are BF16/F16 on CUDA are dropped as it is loaded;
everything else runs as published. The file casts to lower precision in places (q, k, v to BF16;
the residual stream to F32 after each Mamba layer; the per-head RMSNorm, A, D, the dt bias in F32):
inside float64_islands() a cast of a float64 tensor to F32/BF16/F16 keeps float64, so the
comparison measures the algorithm at float64 rounding. Adaptations to transformers 5 (the file
was written for 4.46): a dict for _tied_weights_keys, an empty Cache initialiser, and
is_flash_attn_greater_or_equal_2_10 answered without probing for flash_attn.

Prints, per scaled-down config: the forward logits' largest difference; for prompts at least as
long as the window and shorter than it, the largest difference of every decode step's logits and
of the state after the last token (the file's SambaYCache against the reference's prefill);
greedy tokens; and which positions the file's sliding-window slots hold while decoding from a
short prompt.
"""

import argparse
import contextlib
import importlib
import os
import re
import sys
import types

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import phi4flash_reference as R  # noqa: E402

def _attn(q, k, v, softmax_scale, causal, window_size):
    """q (sq, hq, d), k, v (sk, hk, d), one sequence."""
    sq, hq, d = q.shape
    sk, hk = k.shape[:2]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    kv = torch.arange(hq) // (hq // hk)
    s = torch.einsum("qhd,khd->hqk", q, k[:, kv]) * scale
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool)
    left, right = window_size
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        ok &= j >= i + sk - sq - left
    if causal or right >= 0:
        ok &= j <= i + sk - sq + right
    s = s.masked_fill(~ok, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v[:, kv])


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), **kw):
    return torch.stack([_attn(q[b], k[b], v[b], softmax_scale, causal, window_size)
                        for b in range(q.shape[0])])


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), **kw):
    out = []
    for b in range(len(cu_seqlens_q) - 1):
        qs, qe = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        ks, ke = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        out.append(_attn(q[qs:qe], k[ks:ke], v[ks:ke], softmax_scale, causal, window_size))
    return torch.cat(out)


def index_first_axis(x, indices):
    return x[indices]


def pad_input(hidden, indices, batch, seqlen):
    out = torch.zeros((batch * seqlen,) + hidden.shape[1:], dtype=hidden.dtype)
    out[indices] = hidden
    return out.view((batch, seqlen) + hidden.shape[1:])


def unpad_input(hidden, mask):
    seqlens = mask.sum(-1, dtype=torch.int32)
    idx = torch.nonzero(mask.flatten()).flatten()
    cu = F.pad(torch.cumsum(seqlens, 0, dtype=torch.int32), (1, 0))
    return hidden.reshape((-1,) + hidden.shape[2:])[idx], idx, cu, int(seqlens.max())


def scan_fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus):
    """u, delta, z (b, d, l); A (d, n); B, C (b, 1, n, l); D, delta_bias (d,)."""
    if delta_bias is not None:
        delta = delta + delta_bias[None, :, None]
    if delta_softplus:
        delta = F.softplus(delta)
    b, d, l = u.shape
    h = torch.zeros(b, d, A.shape[1], dtype=u.dtype)
    ys = []
    for t in range(l):
        h = torch.exp(delta[:, :, t, None] * A) * h + delta[:, :, t, None] * B[:, 0, None, :, t] * u[:, :, t, None]
        ys.append((h * C[:, 0, None, :, t]).sum(-1))
    out = torch.stack(ys, -1)
    if D is not None:
        out = out + D[None, :, None] * u
    x = torch.zeros(b, d, 1, 2 * A.shape[1], dtype=u.dtype)
    x[..., 1::2] = h[:, :, None]
    if z is None:
        return out, x
    return out, x, out * F.silu(z)


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, **kw):
    """mamba_ssm's Triton selective_state_update for one token: state (b, d, n) updated in place;
    x, dt, z (b, d); B, C (b, n); returns C.state + D x, times silu(z) when z is given."""
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt)
    state.copy_(torch.exp(dt[..., None] * A) * state + dt[..., None] * B[:, None, :] * x[..., None])
    out = (state * C[:, None, :]).sum(-1)
    if D is not None:
        out = out + D * x
    return out if z is None else out * F.silu(z)


def install_stubs(ssu_fn):
    fa = types.ModuleType("flash_attn")
    fa.flash_attn_func, fa.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    bp = types.ModuleType("flash_attn.bert_padding")
    bp.index_first_axis, bp.pad_input, bp.unpad_input = index_first_axis, pad_input, unpad_input
    fa.bert_padding = bp
    cc = types.ModuleType("causal_conv1d")
    cc.causal_conv1d_fn = cc.causal_conv1d_update = None
    ms = types.ModuleType("selective_scan_cuda")
    ms.fwd = scan_fwd
    ssu = types.ModuleType("mamba_ssm.ops.triton.selective_state_update")
    ssu.selective_state_update = ssu_fn
    mods = {"flash_attn": fa, "flash_attn.bert_padding": bp, "causal_conv1d": cc,
            "causal_conv1d_cuda": types.ModuleType("causal_conv1d_cuda"),
            "selective_scan_cuda": ms, "mamba_ssm": types.ModuleType("mamba_ssm"),
            "mamba_ssm.ops": types.ModuleType("mamba_ssm.ops"),
            "mamba_ssm.ops.triton": types.ModuleType("mamba_ssm.ops.triton"),
            "mamba_ssm.ops.triton.selective_state_update": ssu}
    sys.modules.update(mods)
    import torch.cuda.jiterator as jit

    def create_jit_fn(code, **kw):
        assert "swiglu_fwd" in code or "glu" in code
        return lambda x, y: x * y * torch.sigmoid(x)

    jit._create_jit_fn = create_jit_fn
    jit._create_multi_output_jit_fn = lambda code, num_outputs, **kw: None


_LOW = (torch.float32, torch.bfloat16, torch.float16)


@contextlib.contextmanager
def float64_islands():
    to, flt = torch.Tensor.to, torch.Tensor.float

    def to64(self, *args, **kw):
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a in _LOW else a for a in args)
            if kw.get("dtype") in _LOW:
                kw["dtype"] = torch.float64
        return to(self, *args, **kw)

    def float64(self, *args, **kw):
        return self if self.dtype == torch.float64 else flt(self, *args, **kw)

    torch.Tensor.to, torch.Tensor.float = to64, float64
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float = to, flt


def load_published(src_dir, fallback_ssm):
    text = open(os.path.join(src_dir, "modeling_phi4flash.py")).read()
    text, n = re.subn(r"(?m)^\s*assert q\.(dtype|is_cuda).*\n", "", text)
    assert n == 2, n
    pkg = os.path.join(os.environ.get("TMPDIR", "/tmp"), "phi4flash_crosscheck_pkg")
    os.makedirs(os.path.join(pkg, "phi4flash"), exist_ok=True)
    open(os.path.join(pkg, "phi4flash", "__init__.py"), "w").close()
    with open(os.path.join(pkg, "phi4flash", "modeling_loaded.py"), "w") as f:
        f.write(text.replace("from .configuration_phi4flash", "from phi4flash.configuration_phi4flash"))
    with open(os.path.join(pkg, "phi4flash", "configuration_phi4flash.py"), "w") as f:
        f.write(open(os.path.join(src_dir, "configuration_phi4flash.py")).read())
    sys.path.insert(0, pkg)
    # transformers probes for flash_attn when first imported: import it before the stand-ins exist
    import transformers.activations, transformers.modeling_utils, transformers.generation  # noqa
    import transformers.cache_utils, transformers.modeling_outputs  # noqa
    install_stubs(None if fallback_ssm else selective_state_update)
    M = importlib.import_module("phi4flash.modeling_loaded")
    M.is_flash_attn_greater_or_equal_2_10 = lambda: True
    M.Phi4FlashForCausalLM._tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    M.Cache.__init__ = lambda self, *a, **k: None
    return M, importlib.import_module("phi4flash.configuration_phi4flash")


def build(M, Cfg, cfg, tensors):
    config = Cfg.Phi4FlashConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "eager"  # read by the file only for a padding-side check
    model = M.Phi4FlashForCausalLM(config).to(torch.float64).eval()
    for mod in model.modules():
        if isinstance(mod, M.Phi3Mamba):
            mod.use_fast_path = False  # the fused path is CUDA-only
    sd = dict(tensors)
    sd["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return config, model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--published", required=True, help="directory with modeling_phi4flash.py")
    ap.add_argument("--fallback-ssm", action="store_true")
    a = ap.parse_args()
    M, Cfg = load_published(a.published, a.fallback_ssm)
    CASES = [dict(layers=8, hidden=32, heads=4, kv_heads=2, window=5),
             dict(layers=8, hidden=48, heads=6, kv_heads=2, window=3, d_state=8),
             dict(layers=12, hidden=32, heads=4, kv_heads=4, window=4, d_conv=3),
             dict(layers=16, hidden=64, heads=8, kv_heads=4, window=6)]
    T = 14
    worst = {}

    def note(k, v):
        worst[k] = max(worst.get(k, 0.0), v)

    for ci, kw in enumerate(CASES):
        cfg = R.make_config(**kw)
        t = R.random_tensors(cfg, 10 + ci)
        config, model = build(M, Cfg, cfg, t)
        tok = torch.randint(0, cfg["vocab_size"], (2, T), generator=torch.Generator().manual_seed(ci))
        ref = R.forward(cfg, t, tok)
        with torch.no_grad(), float64_islands():
            hf = model(input_ids=tok, use_cache=False).logits
        d = (hf - ref).abs().max().item()
        note("forward", d)
        print(f"case {ci} {kw}: forward max|diff| {d:.2e} (max|logit| {ref.abs().max():.2f})")
        W = kw["window"]
        for P in sorted({1, W - 2, W, W + 3} - {0, -1}):
            if P < 1:
                continue
            cache = M.SambaYCache(config, max_batch_size=2, max_cache_len=T, device="cpu", dtype=torch.float64)
            with torch.no_grad(), float64_islands():
                out = model(input_ids=tok[:, :P], attention_mask=torch.ones(2, P, dtype=torch.long),
                            past_key_values=cache, use_cache=True, cache_position=torch.arange(P))
                diffs = [(out.logits[:, -1] - ref[:, P - 1]).abs().max().item()]
                for s in range(P, T):
                    out = model(input_ids=tok[:, s:s + 1], attention_mask=torch.ones(2, s + 1, dtype=torch.long),
                                past_key_values=cache, use_cache=True, cache_position=torch.tensor([s]))
                    diffs.append((out.logits[:, -1] - ref[:, s]).abs().max().item())
            # the file's state after T tokens against the reference's prefill of T tokens
            _, st = R.prefill(cfg, t, tok)
            sd = 0.0
            for i in st.conv:
                sd = max(sd, (cache.key_cache[i][..., 1:] - st.conv[i]).abs().max().item(),
                         (cache.value_cache[i] - st.ssm[i]).abs().max().item())
            g = cfg["num_hidden_layers"] // 2 + 1
            sd = max(sd, (cache.key_cache[g].transpose(1, 2) - st.kv[0]).abs().max().item(),
                     (cache.value_cache[g].transpose(1, 2) - st.kv[1]).abs().max().item())
            # sliding caches hold positions T-W..T-1 in order once the window has been filled
            swa = max((cache.key_cache[i].transpose(1, 2) - st.swa[i][0]).abs().max().item() for i in st.swa)
            tag = "prompt >= window" if P >= W else "prompt < window"
            key = f"decode ({tag})"
            note(key, max(diffs))
            note(f"state ({tag}) mamba+yoco", sd)
            note(f"state ({tag}) sliding", swa)
            bad = [s for s, dd in zip(range(P - 1, T), diffs) if dd > 1e-9]
            print(f"   prompt {P:2d}: decode max|diff| {max(diffs):.2e}; positions off: {bad}; "
                  f"state mamba/yoco {sd:.1e}, sliding {swa:.1e}")
        # greedy: the file's prefill + step path, token by token, against the reference's greedy
        P = W + 1
        cache = M.SambaYCache(config, max_batch_size=2, max_cache_len=P + 8, device="cpu", dtype=torch.float64)
        seq = tok[:, :P]
        with torch.no_grad(), float64_islands():
            out = model(input_ids=seq, attention_mask=torch.ones(2, P, dtype=torch.long), past_key_values=cache,
                        use_cache=True, cache_position=torch.arange(P))
            gen = [out.logits[:, -1].argmax(-1)]
            for s in range(P, P + 7):
                out = model(input_ids=gen[-1][:, None], attention_mask=torch.ones(2, s + 1, dtype=torch.long),
                            past_key_values=cache, use_cache=True, cache_position=torch.tensor([s]))
                gen.append(out.logits[:, -1].argmax(-1))
        gen = torch.stack(gen, 1)
        rg = R.greedy(cfg, t, seq, 8)
        print("   greedy equal:", bool((gen == rg).all()), rg[0].tolist())
        note("greedy mismatches", float((gen != rg).sum()))

    print("WORST", {k: f"{v:.2e}" for k, v in worst.items()})
    slots(M, Cfg)


def slots(M, Cfg):
    """Which positions the file's sliding-window slots hold, decoding from a 2-token prompt."""
    cfg = R.make_config(window=5)
    t = R.random_tensors(cfg, 10)
    config, model = build(M, Cfg, cfg, t)
    T = 8
    tok = torch.randint(0, cfg["vocab_size"], (1, T), generator=torch.Generator().manual_seed(0))
    _, full = R.prefill(dict(cfg, sliding_window=T), t, tok)
    K = full.swa[1][0][0]                        # layer 1's keys of every position
    cache = M.SambaYCache(config, max_batch_size=1, max_cache_len=T, device="cpu", dtype=torch.float64)
    P = 2
    with torch.no_grad(), float64_islands():
        model(input_ids=tok[:, :P], attention_mask=torch.ones(1, P, dtype=torch.long),
              past_key_values=cache, use_cache=True, cache_position=torch.arange(P))
        for s in range(P, T):
            model(input_ids=tok[:, s:s + 1], attention_mask=torch.ones(1, s + 1, dtype=torch.long),
                  past_key_values=cache, use_cache=True, cache_position=torch.tensor([s]))
            held = []
            for slot in cache.key_cache[1][0].transpose(0, 1):
                m = [p for p in range(T) if torch.allclose(slot, K[p], atol=1e-12)]
                held.append(str(m[0]) if m else ("zero" if slot.abs().max() == 0 else "?"))
            print(f"window 5, after decoding position {s}: layer 1's slots hold {held}")


if __name__ == "__main__":
    main()
