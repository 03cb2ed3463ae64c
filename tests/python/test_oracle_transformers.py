"""The real transformers library as the oracle of diffattn's Hugging Face compatibility:

- diffattn.torch.DiffLlamaAttention against transformers' own DiffLlamaAttention (the module
  from transformers.models.diffllama, not a copy): output and every gradient, GQA, biases, odd
  key/value head counts (as the equivalent checkpoint with repeated heads), a left-padded
  batch, and a prefill then decoding through transformers' DynamicCache;
- transformers' DiffLlamaForCausalLM / LlamaForCausalLM load every kind of directory
  `diffattn convert --to hf` writes (f32, bf16, sharded, tied) with diffattn's logits and greedy
  tokens;
- diffattn loads directories written by transformers' save_pretrained (models initialised from
  transformers' config classes: GQA, llama3 RoPE scaling, tied embeddings, bf16) with
  transformers' logits.

Accuracy (FlashAttention's rule): diffattn's error against transformers in float64 is at most
twice transformers' own float32 error against float64, plus two float32 ulps of the scale;
bf16 checkpoints are computed in float32 on their bf16 weights by both sides, so the same rule
holds. Greedy tokens are equal, or part only where the float64 top-2 logits are closer than
twice the float32 error (a tie rounding may break either way)."""

import json
import math

import numpy as np
import pytest
import torch
from transformers import (DiffLlamaConfig, DiffLlamaForCausalLM, LlamaConfig,
                          LlamaForCausalLM)
from transformers.cache_utils import DynamicCache
from transformers.models.diffllama.modeling_diffllama import \
    DiffLlamaAttention as HfDiffLlamaAttention
from transformers.models.diffllama.modeling_diffllama import DiffLlamaRotaryEmbedding

import diffattn
import diffattn.torch as dt
import model_helpers as mh
import torch_model as tm

EPS32 = 2.0 ** -24


def rule(name, got, ref64, ref32, factor=2.0, floor=0.0):
    got, ref64, ref32 = (np.asarray(x.detach().double() if torch.is_tensor(x) else x, np.float64)
                         for x in (got, ref64, ref32))
    naive = float(np.abs(ref32 - ref64).max())
    err = float(np.abs(got - ref64).max())
    bound = factor * naive + 2 * EPS32 * float(np.abs(ref64).max()) + floor
    assert err <= bound, f"{name}: error {err:.3e} > {bound:.3e} (float32 transformers {naive:.3e})"


# ------------------------------------------------------------------ the attention module


def hf_config(N, NKV, D=8, bias=False, hidden=32):
    c = DiffLlamaConfig(hidden_size=hidden, num_attention_heads=N, num_key_value_heads=NKV,
                        head_dim=D, rms_norm_eps=1e-5, attention_bias=bias, rope_theta=10000.0,
                        intermediate_size=64, num_hidden_layers=4, vocab_size=64,
                        max_position_embeddings=128)
    c._attn_implementation = "eager"
    return c


def repeated_kv(state, N, NKV, D):
    """The state_dict of the same attention with one key/value head per query head: each
    key/value head's rows repeated N/NKV times (what an odd head count means in DiffLlama)."""
    s = dict(state)
    for n in ("k_proj", "v_proj"):
        w = s[n + ".weight"].view(NKV, D, -1)
        s[n + ".weight"] = w.repeat_interleave(N // NKV, dim=0).reshape(N * D, -1)
        if n + ".bias" in s:
            s[n + ".bias"] = s[n + ".bias"].view(NKV, D).repeat_interleave(N // NKV, 0).reshape(-1)
    return s


def randomised(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return module


def causal_mask(B, T, Tk, keep=None, dtype=torch.float32):
    """transformers' 4-D additive mask (B, 1, T, Tk): 0 where query t (the last T of Tk
    positions) may see key j, the dtype's minimum elsewhere; keep (B, Tk) marks real keys."""
    allowed = torch.ones(T, Tk, dtype=torch.bool).tril(Tk - T)[None].expand(B, T, Tk)
    if keep is not None:
        allowed = allowed & keep.bool()[:, None, :]
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed[:, None], zero, torch.full((), torch.finfo(dtype).min, dtype=dtype))


def hf_module(cfg_hf, layer, state, dtype):
    m = HfDiffLlamaAttention(cfg_hf, layer_idx=layer)
    m.load_state_dict(state)
    return m.to(dtype)


def rotary(cfg_hf, x, positions):
    return DiffLlamaRotaryEmbedding(cfg_hf)(x, positions)


# N, NKV (odd: checked as the repeated-heads checkpoint), bias
MODULE_CASES = [(4, 4, False), (8, 4, True), (4, 2, False), (8, 2, False), (6, 3, False),
                (4, 1, False)]


@pytest.mark.parametrize("N,NKV,bias", MODULE_CASES)
def test_module_matches_transformers_output_and_gradients(N, NKV, bias):
    cfg = dict(hidden_size=32, num_attention_heads=N, num_key_value_heads=NKV, head_dim=8,
               rms_norm_eps=1e-5, attention_bias=bias, rope_theta=10000.0)
    ours = randomised(dt.DiffLlamaAttention(cfg, layer_idx=3), N + NKV)
    state = {k: v.detach().clone() for k, v in ours.state_dict().items()}
    NKV_hf = NKV if NKV % 2 == 0 else N
    hf_state = state if NKV_hf == NKV else repeated_kv(state, N, NKV, 8)
    cfg_hf = hf_config(N, NKV_hf, bias=bias)
    B, T = 2, 19
    x = torch.randn(B, T, 32, generator=torch.Generator().manual_seed(1))
    dout = torch.randn(B, T, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pos = torch.arange(T)[None].expand(B, T)
    refs = {}
    # float64, float32, and float32 with the batch reversed: a parameter's gradient is a sum
    # over the batch, and for lambda's (one cancelling sum) the float32 error depends on the
    # order; the float32 baseline is the worse of the two orders.

    def run(dtype, rows):
        """transformers' output and gradients on the batch rows `rows`, in dtype."""
        m = hf_module(cfg_hf, 3, hf_state, dtype)
        xx = x[rows].to(dtype).detach().clone().requires_grad_()
        y, _ = m(xx, rotary(cfg_hf, xx, pos[rows]),
                 attention_mask=causal_mask(len(rows), T, T, dtype=dtype))
        params = dict(m.named_parameters())
        grads = torch.autograd.grad(y, [xx, *params.values()], dout[rows].to(dtype))
        return y, dict(zip(["x", *params], grads))

    # float64, then float32 in three summation orders: the batch at once, reversed, and row by
    # row with the parameter gradients added after. A parameter's gradient is a sum over the
    # batch; for lambda's (one cancelling sum over every token) the float32 error depends on
    # the order, so the float32 baseline is the worst of the three.
    y64, g64 = run(torch.float64, [0, 1])
    y32, g32 = run(torch.float32, [0, 1])
    _, g32r = run(torch.float32, [1, 0])
    g32r["x"] = g32r["x"].flip(0)
    (_, ga), (_, gb) = run(torch.float32, [0]), run(torch.float32, [1])
    g32s = {n: torch.cat((ga[n], gb[n])) if n == "x" else ga[n] + gb[n] for n in ga}
    worse = {}
    for n in g64:
        cands = torch.stack([g[n].double() for g in (g32, g32r, g32s)])
        idx = (cands - g64[n]).abs().argmax(0, keepdim=True)
        worse[n] = cands.gather(0, idx)[0]
    refs = {torch.float64: (y64, g64), torch.float32: (y32, worse)}
    xx = x.detach().clone().requires_grad_()
    cos, sin = rotary(cfg_hf, xx, pos)
    # Our operator's output and its o2 kept, for the condition of lambda's gradient below.
    seen = {}

    def stash(q, k, v, lam, causal=False, scale=None):
        out, _, o2 = torch.ops.diffattn.diff_attention_fwd(q, k, v, lam, causal, scale, "auto")
        out.retain_grad()
        seen.update(out=out, o2=o2)
        return out

    real = dt.modules.diff_attention
    dt.modules.diff_attention = stash
    try:
        y, _ = ours(xx, position_embeddings=(cos, sin))
    finally:
        dt.modules.diff_attention = real
    y.backward(dout.float())
    # dlambda = -sum(g . o2) over every row and pair: one sum of B T P 2D terms that cancel (by
    # about 60x on these seeds), so any float32 evaluation of it, transformers' included, is off
    # by up to a rounding of sum |g . o2|; transformers' own float32 error is one sample of that
    # and can be lucky. The floor adds one float32 rounding of that sum, times d lambda / d param.
    cond = float((seen["out"].grad.double() * seen["o2"].double()).abs().sum())
    with torch.no_grad():
        e1 = torch.exp((ours.lambda_q1.double() * ours.lambda_k1.double()).sum())
        e2 = torch.exp((ours.lambda_q2.double() * ours.lambda_k2.double()).sum())
        dlam_dp = {"lambda_q1": e1 * ours.lambda_k1.double(), "lambda_k1": e1 * ours.lambda_q1.double(),
                   "lambda_q2": e2 * ours.lambda_k2.double(), "lambda_k2": e2 * ours.lambda_q2.double()}
    rule("output", y, refs[torch.float64][0], refs[torch.float32][0])
    rule("dx", xx.grad, refs[torch.float64][1]["x"], refs[torch.float32][1]["x"])
    for n, p in ours.named_parameters():
        if NKV_hf != NKV and n.split(".")[0] in ("k_proj", "v_proj"):
            # the repeated checkpoint's gradient sums back over its copies
            want = {dtype: refs[dtype][1][n].reshape(NKV, N // NKV, 8, -1).sum(1).reshape(p.shape)
                    for dtype in refs}
        else:
            want = {dtype: refs[dtype][1][n] for dtype in refs}
        floor = EPS32 * cond * float(dlam_dp[n].abs().max()) if n in dlam_dp else 0.0
        rule("d " + n, p.grad, want[torch.float64], want[torch.float32], floor=floor)


def test_module_left_padding_matches_transformers():
    """A left-padded batch with transformers' 4-D mask and the positions transformers gives
    padded rows: every real query row equals transformers' (padded rows: ours are zeros)."""
    cfg = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
               rms_norm_eps=1e-5, rope_theta=10000.0)
    ours = randomised(dt.DiffLlamaAttention(cfg, layer_idx=2), 7)
    cfg_hf = hf_config(4, 2)
    B, T, pads = 2, 13, [0, 4]
    x = torch.randn(B, T, 32, generator=torch.Generator().manual_seed(3))
    keep = torch.ones(B, T, dtype=torch.long)
    keep[1, :pads[1]] = 0
    pos = (keep.cumsum(1) - 1).clamp(min=0)
    outs = {}
    for dtype in (torch.float64, torch.float32):
        m = hf_module(cfg_hf, 2, ours.state_dict(), dtype)
        with torch.no_grad():
            outs[dtype] = m(x.to(dtype), rotary(cfg_hf, x.to(dtype), pos),
                            attention_mask=causal_mask(B, T, T, keep, dtype))[0]
    with torch.no_grad():
        for mask in (keep, causal_mask(B, T, T, keep)):
            y, _ = ours(x, position_embeddings=rotary(cfg_hf, x, pos), attention_mask=mask)
            for b, p in enumerate(pads):
                rule(f"row {b}", y[b, p:], outs[torch.float64][b, p:], outs[torch.float32][b, p:])
                assert torch.count_nonzero(y[b, :p]) == 0


def test_module_with_transformers_dynamic_cache():
    """Prefill of 10 tokens, then 6 steps of one, each side with its own DynamicCache: every
    step equals transformers' step."""
    cfg = dict(hidden_size=32, num_attention_heads=8, num_key_value_heads=4, head_dim=8,
               rms_norm_eps=1e-5, rope_theta=10000.0)
    ours = randomised(dt.DiffLlamaAttention(cfg, layer_idx=1), 8)
    cfg_hf = hf_config(8, 4)
    T, T0 = 16, 10
    x = torch.randn(1, T, 32, generator=torch.Generator().manual_seed(4))
    hf = {dtype: hf_module(cfg_hf, 1, ours.state_dict(), dtype)
          for dtype in (torch.float64, torch.float32)}
    caches = {dtype: DynamicCache() for dtype in hf}
    mine = DynamicCache()
    spans = [(0, T0)] + [(t, t + 1) for t in range(T0, T)]
    with torch.no_grad():
        for a, b in spans:
            pos = torch.arange(a, b)[None]
            refs = {}
            for dtype, m in hf.items():
                xs = x[:, a:b].to(dtype)
                mask = causal_mask(1, b - a, b, dtype=dtype) if b - a > 1 else None
                refs[dtype] = m(xs, rotary(cfg_hf, xs, pos), attention_mask=mask,
                                cache=caches[dtype])[0]
            y, _ = ours(x[:, a:b], position_embeddings=rotary(cfg_hf, x[:, a:b], pos),
                        past_key_values=mine)
            rule(f"positions {a}..{b - 1}", y, refs[torch.float64], refs[torch.float32])
    assert mine.get_seq_length(1) == T


# ------------------------------------------------------------------ whole models


def hf_logits(model_dir, cls, tokens, dtype):
    m = cls.from_pretrained(model_dir, dtype=dtype).eval()
    with torch.no_grad():
        return m(torch.as_tensor(tokens)).logits.double().numpy(), m


def check_greedy(ours, theirs, steps, what):
    if list(ours) == list(theirs):
        return
    k = next(i for i in range(min(len(ours), len(theirs))) if ours[i] != theirs[i])
    gap, e32 = steps[k]
    assert gap <= 2 * e32, (f"{what}: greedy {list(ours)} != transformers {list(theirs)}, parting at "
                            f"step {k} where the float64 top-2 gap {gap:.3g} > 2 x {e32:.3g}")


def greedy_steps(m64, m32, prompt, n):
    """transformers' greedy continuation in float64 and, per step, (top-2 gap, float32 error)."""
    ids, steps = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            t = torch.tensor([ids])
            l64 = m64(t).logits[0, -1].double()
            l32 = m32(t).logits[0, -1].double()
            top = torch.topk(l64, 2).values
            steps.append((float(top[0] - top[1]), float((l32 - l64).abs().max())))
            ids.append(int(l64.argmax()))
    return ids[len(prompt):], steps


def project_config(kind, tied):
    return {"format": "diffattn/1", "attention": kind, "vocab_size": 96, "d_model": 32,
            "n_layers": 2, "n_heads": 2 if kind == "diff_v1" else 4, "n_kv_heads": 1 if kind == "diff_v1" else 2,
            "head_dim": 8, "ffn_dim": 64, "max_seq_len": 64, "rope_theta": 10000.0,
            "norm_eps": 1e-5, "tie_embeddings": tied}


CONVERT_CASES = [("diff_v1", "f32", 1, False), ("diff_v1", "bf16", 1, False),
                 ("diff_v1", "f32", 3, True), ("standard", "f32", 1, True),
                 ("standard", "bf16", 2, False)]


@pytest.mark.parametrize("kind,dtype,shards,tied", CONVERT_CASES,
                         ids=[f"{k}-{d}-{s}shards{'-tied' if t else ''}" for k, d, s, t in CONVERT_CASES])
def test_transformers_loads_what_convert_writes(tmp_path, kind, dtype, shards, tied):
    pc = project_config(kind, tied)
    src, out = tmp_path / "project", tmp_path / "hf"
    tm.save_model_dir(str(src), pc, tm.random_weights(pc, 5))
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", out, "--dtype", dtype,
               "--shards", shards)
    cls = DiffLlamaForCausalLM if kind == "diff_v1" else LlamaForCausalLM
    with open(out / "config.json") as f:
        assert json.load(f)["model_type"] == ("diffllama" if kind == "diff_v1" else "llama")
    tokens = np.random.default_rng(6).integers(0, 96, (2, 12)).astype(np.int64)
    l64, m64 = hf_logits(str(out), cls, tokens, torch.float64)
    l32, m32 = hf_logits(str(out), cls, tokens, torch.float32)
    assert np.abs(l64).max() > 1.0 and l64.std() > 0.3  # not flat: the comparison can fail
    ours = diffattn.load_model(str(out))
    rule("logits", ours.forward(tokens), l64, l32)
    prompt = [3, 14, 15, 92, 65]
    want, steps = greedy_steps(m64, m32, prompt, 10)
    with torch.no_grad():
        theirs = m32.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    check_greedy(theirs, want, steps, "transformers float32 itself")
    check_greedy(ours.generate(prompt, 10, temperature=0.0), want, steps, "diffattn")


def _big_init(model, seed):
    """Weights large enough that the logits are far from flat (transformers' init is 0.02)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            base = 1.0 if n.endswith("norm.weight") or "layernorm" in n else 0.0
            p.copy_(base + 0.25 * torch.randn(p.shape, generator=g))
    return model


SAVE_CASES = {
    "llama-gqa": (LlamaConfig, dict(num_attention_heads=4, num_key_value_heads=2), torch.float32),
    "llama-llama3-scaling-tied": (LlamaConfig, dict(
        num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        torch.float32),
    "llama-bf16": (LlamaConfig, dict(num_attention_heads=4, num_key_value_heads=2), torch.bfloat16),
    "diffllama-gqa": (DiffLlamaConfig, dict(num_attention_heads=8, num_key_value_heads=4),
                      torch.float32),
    "diffllama-tied-bf16": (DiffLlamaConfig, dict(num_attention_heads=4, num_key_value_heads=2,
                                                  tie_word_embeddings=True), torch.bfloat16),
}


@pytest.mark.parametrize("name", sorted(SAVE_CASES))
def test_diffattn_loads_what_save_pretrained_writes(tmp_path, name):
    cls_cfg, over, dtype = SAVE_CASES[name]
    cfg = cls_cfg(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0, **over)
    cls = DiffLlamaForCausalLM if cls_cfg is DiffLlamaConfig else LlamaForCausalLM
    torch.manual_seed(0)
    model = _big_init(cls(cfg), 11).to(dtype)
    model.save_pretrained(tmp_path / name)
    tokens = np.random.default_rng(7).integers(0, 80, (2, 13)).astype(np.int64)
    # both sides compute in float32 (transformers: the stored weights widened; float64 the
    # reference), so a bf16 checkpoint is compared on its own bf16 weights
    l64, _ = hf_logits(str(tmp_path / name), cls, tokens, torch.float64)
    l32, _ = hf_logits(str(tmp_path / name), cls, tokens, torch.float32)
    assert np.abs(l64).max() > 1.0 and l64.std() > 0.3
    rule("logits", diffattn.load_model(str(tmp_path / name)).forward(tokens), l64, l32)


def test_llama3_scaling_changes_the_logits(tmp_path):
    """The scaled and unscaled models differ at these positions, so the case above would catch
    a loader that ignored rope_scaling."""
    tokens = np.random.default_rng(8).integers(0, 80, (1, 40)).astype(np.int64)
    base = dict(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                max_position_embeddings=64, num_attention_heads=4, num_key_value_heads=2)
    out = []
    for sc in (None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16}):
        torch.manual_seed(0)
        m = _big_init(LlamaForCausalLM(LlamaConfig(rope_scaling=sc, **base)), 3)
        m.save_pretrained(tmp_path / str(len(out)))
        out.append(diffattn.load_model(str(tmp_path / str(len(out)))).forward(tokens))
    assert np.abs(out[0] - out[1]).max() > 1e-3 * np.abs(out[0]).max()
    assert math.isfinite(float(np.abs(out[1]).max()))
