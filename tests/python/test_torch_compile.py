"""diffattn.torch as PyTorch 2 custom ops: torch.library.opcheck on every op (schema, fake
kernel, autograd registration, AOT dispatch with dynamic shapes), inputs as transposed views of
(B, heads, T, D) tensors included; torch.compile(fullgraph=True) of the operators, the three
attention modules and a model from diffattn.torch.load runs with no graph break and equals
eager, forward and gradients; a compiled training step still runs one forward and one
backward kernel per attention call."""

import json

import pytest
import torch

import diffattn
import diffattn.torch as dt
import torch_model as tm

OPS = torch.ops.diffattn


def views(x):
    """x with the same values laid out (B, heads, T, D): what attention code hands over."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def diff_inputs(B=2, Tq=9, Tk=9, H=2, G=1, D=8, Dv=16, shared=False, lam_token=False, seed=0,
                transposed=False, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, 2 * H, D, generator=g)
    k = torch.randn(B, Tk, G if shared else 2 * G, D, generator=g)
    v = torch.randn(B, Tk, G, Dv, generator=g)
    lam = 0.1 + 0.8 * torch.rand((B, Tq, H) if lam_token else (H,), generator=g)
    if transposed:
        q, k, v = views(q), views(k), views(v)
    if grad:
        for x in (q, k, v, lam):
            x.requires_grad_()
    return q, k, v, lam


DIFF_CASES = [
    dict(),                                                   # V1, GQA at the pair level
    dict(transposed=True),                                    # (B, heads, T, D) views
    dict(shared=True, lam_token=True, Dv=8, H=4, G=2),        # V2: shared keys, lambda per token
    dict(Tq=3, Tk=11, B=1),                                   # Tq < Tk
]


@pytest.mark.parametrize("case", DIFF_CASES, ids=["v1_gqa", "transposed", "v2", "tq_lt_tk"])
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_diff_attention(case, causal):
    q, k, v, lam = diff_inputs(grad=True, **case)
    torch.library.opcheck(OPS.diff_attention_fwd, (q, k, v, lam, causal, None, "auto"))
    out, lse, o2 = OPS.diff_attention_fwd(q.detach(), k.detach(), v.detach(), lam.detach(),
                                          causal, 0.3, "fused")
    dout = torch.randn_like(out)
    torch.library.opcheck(OPS.diff_attention_bwd,
                          (dout, q.detach(), k.detach(), v.detach(), lam.detach(), out, lse, o2,
                           causal, 0.3, "fused"))


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_attention(transposed, causal):
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 7, 4, 8, generator=g), torch.randn(2, 7, 2, 8, generator=g), \
        torch.randn(2, 7, 2, 8, generator=g)
    if transposed:
        q, k, v = views(q), views(k), views(v)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    torch.library.opcheck(OPS.attention_fwd, (q, k, v, causal, None, "auto"))
    out, lse = OPS.attention_fwd(q.detach(), k.detach(), v.detach(), causal, None, "auto")
    torch.library.opcheck(OPS.attention_bwd, (torch.randn_like(out), q.detach(), k.detach(),
                                              v.detach(), out, lse, causal, None, "auto"))


def test_opcheck_kvcache_ops():
    g = torch.Generator().manual_seed(2)
    B, H, G, D, bs = 2, 2, 1, 8, 4
    q = torch.randn(B, 1, 2 * H, D, generator=g)
    kc = torch.randn(6, bs, 2 * G, D, generator=g)
    vc = torch.randn(6, bs, G, 2 * D, generator=g)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    table = torch.tensor([[3, 1, 0], [2, 5, 4]], dtype=torch.int32)
    lam = torch.tensor([0.3, 0.6])
    torch.library.opcheck(OPS.diff_attention_with_kvcache,
                          (q, kc, vc, lam, lens, table, None, "auto"))
    torch.library.opcheck(OPS.attention_with_kvcache,
                          (q[:, :, :H], kc[:, :, :G], vc, lens, table, None, "auto"))


def _compare(eager_out, comp_out, eager_grads, comp_grads):
    torch.testing.assert_close(comp_out, eager_out, rtol=1e-5, atol=1e-6)
    for a, b in zip(comp_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _run(fn, leaves, dout):
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    return out.detach(), [g.detach() for g in grads]


@pytest.mark.parametrize("kind", ["diff", "diff_v2", "standard"])
def test_compiled_operators_equal_eager(kind):
    torch._dynamo.reset()
    if kind == "standard":
        g = torch.Generator().manual_seed(3)
        leaves = [views(torch.randn(2, 17, 4, 8, generator=g)).requires_grad_(),
                  torch.randn(2, 17, 2, 8, generator=g).requires_grad_(),
                  torch.randn(2, 17, 2, 8, generator=g).requires_grad_()]
        fn = lambda q, k, v: dt.attention(q, k, v, causal=True)  # noqa: E731
    else:
        v2 = kind == "diff_v2"
        leaves = list(diff_inputs(Tq=17, Tk=17, shared=v2, lam_token=v2, Dv=8 if v2 else 16,
                                  transposed=True, grad=True))
        fn = lambda q, k, v, lam: dt.diff_attention(q, k, v, lam, causal=True)  # noqa: E731
    dout = torch.randn(fn(*leaves).shape)
    eager = _run(fn, leaves, dout)
    before = diffattn.kernel_calls()
    comp = _run(torch.compile(fn, fullgraph=True), leaves, dout)
    _compare(*eager[:1], *comp[:1], eager[1], comp[1])
    after = diffattn.kernel_calls()
    # one forward and one backward kernel (the backward takes the saved statistics)
    assert (after["forward"] - before["forward"], after["backward"] - before["backward"]) == (1, 1)


def _module_check(module, x, **kw):
    torch._dynamo.reset()
    xs = x.clone().requires_grad_()
    out = module(xs, **kw)
    out = out[0] if isinstance(out, tuple) else out
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    params = [p for p in module.parameters()]
    eager_grads = torch.autograd.grad(out, [xs, *params], dout)
    compiled = torch.compile(module, fullgraph=True)
    xc = x.clone().requires_grad_()
    outc = compiled(xc, **kw)
    outc = outc[0] if isinstance(outc, tuple) else outc
    comp_grads = torch.autograd.grad(outc, [xc, *params], dout)
    _compare(out.detach(), outc.detach(), eager_grads, comp_grads)


def test_compiled_modules_equal_eager():
    torch.manual_seed(0)
    x = torch.randn(2, 12, 64)
    _module_check(dt.MultiheadDiffAttn(64, depth=2, num_heads=2, num_kv_heads=1), x)
    _module_check(dt.MultiheadDiffAttnV2(64, num_heads=4, num_kv_heads=2), x)
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
    _module_check(dt.DiffLlamaAttention(cfg, layer_idx=1), x)


def test_compiled_model_from_load_equals_eager(tmp_path):
    cfg = {"format": "diffattn/1", "attention": "diff_v1", "vocab_size": 50, "d_model": 32,
           "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 8, "ffn_dim": 48,
           "max_seq_len": 32, "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False}
    tm.save_model_dir(str(tmp_path), cfg, tm.random_weights(cfg, seed=4))
    model = dt.load(tmp_path)
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 50, (2, 16), generator=g)
    targets = torch.randint(0, 50, (2, 16), generator=g)
    torch._dynamo.reset()
    params = list(model.parameters())
    loss = model.loss(tokens, targets)
    eager = torch.autograd.grad(loss, params)
    compiled = torch.compile(model.loss, fullgraph=True)
    lossc = compiled(tokens, targets)
    comp = torch.autograd.grad(lossc, params)
    _compare(loss.detach(), lossc.detach(), eager, comp)
    assert json.loads(json.dumps(model.config))["attention"] == "diff_v1"
