"""diffattn.torch's custom ops with backend="triton": the Triton kernels of diffattn.gpu behind
the same ops, on CPU tensors under TRITON_INTERPRET=1 (tests/python/conftest.py sets it where
no GPU is visible), equal the C++ kernels' forward and gradients within float32 rounding, for
V1, V2 and standard attention, and the paged decode op; opcheck passes for the Triton path."""

import os

import pytest
import torch

import diffattn.torch as dt

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1"
                                and not torch.cuda.is_available(),
                                reason="needs a GPU or Triton's interpreter")


def leaves(*xs):
    return [x.detach().clone().requires_grad_() for x in xs]


@pytest.mark.parametrize("kind", ["v1", "v2", "standard"])
def test_triton_backend_equals_the_cpp_kernels(kind):
    g = torch.Generator().manual_seed(0)
    B, T, H, G, D = 1, 19, 2, 1, 16
    if kind == "standard":
        xs = (torch.randn(B, T, H, D, generator=g), torch.randn(B, T, G, D, generator=g),
              torch.randn(B, T, G, D, generator=g))
        fn = lambda be: lambda q, k, v: dt.attention(q, k, v, causal=True, backend=be)  # noqa
    else:
        v2 = kind == "v2"
        xs = (torch.randn(B, T, 2 * H, D, generator=g),
              torch.randn(B, T, G if v2 else 2 * G, D, generator=g),
              torch.randn(B, T, G, D if v2 else 2 * D, generator=g),
              torch.rand((B, T, H) if v2 else (H,), generator=g))
        fn = lambda be: lambda q, k, v, l: dt.diff_attention(q, k, v, l, causal=True, backend=be)  # noqa
    dout = None
    res = {}
    for be in ("auto", "triton"):
        ls = leaves(*xs)
        out = fn(be)(*ls)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)) if dout is None else dout
        out.backward(dout)
        res[be] = (out.detach(), [x.grad for x in ls])
    torch.testing.assert_close(res["triton"][0], res["auto"][0], rtol=2e-5, atol=2e-5)
    for a, b in zip(res["triton"][1], res["auto"][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_triton_paged_decode_equals_the_cpu_path():
    g = torch.Generator().manual_seed(2)
    B, H, G, D, bs = 2, 2, 1, 16, 4
    q = torch.randn(B, 1, 2 * H, D, generator=g)
    kc = torch.randn(6, bs, 2 * G, D, generator=g)
    vc = torch.randn(6, bs, G, 2 * D, generator=g)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    table = torch.tensor([[3, 1, 0], [2, 5, 4]], dtype=torch.int32)
    lam = torch.tensor([0.3, 0.6])
    cpu = dt.diff_attention_with_kvcache(q, kc, vc, lam, lens, table)
    tri = dt.diff_attention_with_kvcache(q, kc, vc, lam, lens, table, backend="triton")
    torch.testing.assert_close(tri, cpu, rtol=2e-5, atol=2e-5)


def test_opcheck_on_the_triton_path():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 5, 4, 16, generator=g), torch.randn(1, 5, 2, 16, generator=g)
    v, lam = torch.randn(1, 5, 1, 32, generator=g), torch.rand(2, generator=g)
    torch.library.opcheck(torch.ops.diffattn.diff_attention_fwd,
                          (q, k, v, lam, True, None, "triton"),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_modules_and_a_loaded_model_run_on_cuda(tmp_path):
    """The modules and diffattn.torch.load's model on CUDA (the Triton kernels) equal their CPU
    selves (the C++ kernels), forward and gradients, in float32."""
    import torch_model as tm
    torch.manual_seed(0)
    x = torch.randn(2, 64, 128)
    for m in (dt.MultiheadDiffAttn(128, depth=2, num_heads=2),
              dt.MultiheadDiffAttnV2(128, num_heads=4, num_kv_heads=2),
              dt.DiffLlamaAttention({"hidden_size": 128, "num_attention_heads": 4,
                                     "num_key_value_heads": 2}, layer_idx=1)):
        y = m(x)
        y = y[0] if isinstance(y, tuple) else y
        yc = m.cuda()(x.cuda())
        yc = yc[0] if isinstance(yc, tuple) else yc
        torch.testing.assert_close(yc.cpu(), y, rtol=1e-4, atol=1e-4)
    cfg = {"format": "diffattn/1", "attention": "diff_v1", "vocab_size": 64, "d_model": 64,
           "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 16, "ffn_dim": 96,
           "max_seq_len": 64, "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False}
    tm.save_model_dir(str(tmp_path), cfg, tm.random_weights(cfg, 1))
    model = dt.load(tmp_path)
    tokens = torch.randint(0, 64, (2, 32))
    loss = model.loss(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model = model.cuda()
    lc = model.loss(tokens[:, :-1].cuda(), tokens[:, 1:].cuda())
    lc.backward()
    torch.testing.assert_close(lc.cpu(), loss, rtol=1e-4, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad.cpu(), grads[n], rtol=1e-3, atol=1e-4)


def test_triton_backend_takes_one_lambda_for_every_pair():
    """lam (1), a V1 layer's one lambda (DiffTransformerLM passes it so), reaches the Triton
    kernels as the 0-d lambda they take; forward and gradients equal the C++ kernels', and
    the lambda's gradient keeps its shape (1)."""
    g = torch.Generator().manual_seed(3)
    B, T, H, D = 1, 17, 2, 16
    q, k, v = (torch.randn(B, T, 2 * H, D, generator=g), torch.randn(B, T, 2 * H, D, generator=g),
               torch.randn(B, T, H, 2 * D, generator=g))
    lam = torch.tensor([0.35])
    dout = torch.randn(B, T, H, 2 * D, generator=g)
    res = {}
    for be in ("fused", "triton"):
        xs = leaves(q, k, v, lam)
        out = dt.diff_attention(*xs, causal=True, backend=be)
        out.backward(dout)
        res[be] = [out] + [x.grad for x in xs]
    assert res["triton"][4].shape == (1,)
    for a, b in zip(res["triton"], res["fused"]):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)
