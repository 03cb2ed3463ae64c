"""Greedy generation with a BF16/F16 KV cache against the F32 cache (issue 15).

A 16-bit cache rounds every stored key and value once, so a greedy continuation may leave the
F32 cache's where that rounding changes which logit is largest, and nowhere else. The oracle is
tests/python/torch_model.py in float64, run twice along a path: with exact keys and values
(l64), and with the keys (after RoPE) and values rounded to the cache's type through float32,
as the cache stores them (l16). The tolerance is tol = 2 eps, eps the largest error of
diffattn's own float32 logits against l64 along the path (float32 arithmetic). Asserted, for
random models of the tiny preset's shapes and each attention kind, 96 new tokens:
  - every token the 16-bit cache picks is an argmax of l16 within tol, along its own path
    (a cache that reads stale, misplaced or wrongly rounded rows picks tokens far from it; the
    same test with the oracle rounding to the wrong 16-bit type fails every case);
  - its ids equal the F32 cache's up to the first step of the F32 path where l16's argmax
    differs from l64's or either's top-2 margin is within tol (before that step both caches
    must pick the same token); that step is printed beside the first divergence (pytest -s).
With this seed the BF16 cache diverges where the oracle says (V1 at step 56, V2 at 49,
standard at 4) and the F16 cache follows the F32 cache for all 96 steps.
"""

import numpy as np
import pytest
import torch

import diffattn
import torch_model as tm

N_NEW = 96
PROMPT = [84, 104, 101, 32, 76, 79, 82, 68]  # "The LORD"


def tiny_config(kind):
    """The tiny preset's shapes (`diffattn train --preset tiny`), max_seq_len 128."""
    c = {"format": "diffattn/1", "attention": kind, "vocab_size": 256, "d_model": 64,
         "n_layers": 2, "ffn_dim": 176, "head_dim": 16, "max_seq_len": 128,
         "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False}
    if kind == "diff_v1":
        c.update(n_heads=2, n_kv_heads=2)
    elif kind == "diff_v2":
        c.update(n_heads=4, n_kv_heads=4, ffn_dim=153)
    else:
        c.update(n_heads=4, n_kv_heads=4)
    return c


TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16}


def rounded(dt):
    # The cache rounds the float32 projection, so round through float32 as it does.
    return lambda u: u.to(torch.float32).to(TORCH_DTYPE[dt]).to(torch.float64)


def oracle(cfg, P, ids, dt, m):
    """Along the path ids: float64 logits with exact keys and values (l64) and with the cache's
    rounding (l16), and the float32 arithmetic tolerance tol = 2 eps."""
    t = torch.tensor([ids])
    with torch.no_grad():
        l64 = tm.forward(cfg, P, t)[0].numpy()
        l16 = tm.forward(cfg, P, t, kv=rounded(dt))[0].numpy()
    l32 = m.forward(np.asarray([ids], dtype=np.int64))[0].astype(np.float64)
    return l64, l16, 2 * np.abs(l32 - l64).max()


def top2_gap(rows):
    top2 = np.sort(rows, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("kind", ["diff_v1", "diff_v2", "standard"])
def test_greedy_16bit_cache_matches_f32_up_to_near_ties(tmp_path, kind, dt):
    cfg = tiny_config(kind)
    # Larger projections than tm.random_weights' default so the logits spread as a trained
    # model's do (a near-uniform random model has near-ties everywhere).
    weights = {k: (v * 4.0 if k.endswith("proj.weight") or k == "lm_head.weight" else v)
               for k, v in tm.random_weights(cfg, seed=11).items()}
    tm.save_model_dir(str(tmp_path), cfg, weights)
    m = diffattn.load_model(str(tmp_path))
    P = tm.params_from(weights)

    ids32 = m.generate(PROMPT, N_NEW, temperature=0.0, kv_dtype="f32")
    ids16 = m.generate(PROMPT, N_NEW, temperature=0.0, kv_dtype=dt)
    assert len(ids32) == len(ids16) == N_NEW
    p = len(PROMPT) - 1  # logits row p + t predicts new token t

    # Every 16-bit pick is an argmax of the float64 model with the rounded cache, within the
    # float32 arithmetic tolerance, along its own path.
    l64, l16, tol = oracle(cfg, P, PROMPT + ids16[:-1], dt, m)
    deficit = np.array([l16[p + t].max() - l16[p + t, tok] for t, tok in enumerate(ids16)])
    print(f"\n{kind} {dt}: tol {tol:.2e}, rounding moves the logits by up to "
          f"{np.abs(l16 - l64)[p:].max():.2e}; largest deficit of a 16-bit pick {deficit.max():.2e}")
    assert deficit.max() <= tol, (
        f"{kind} {dt}: step {int(deficit.argmax())} picked a token {deficit.max():.3e} below the "
        f"argmax of the float64 model with a {dt} cache (tolerance {tol:.3e})")

    # Identical to the F32 cache until the F32 path meets a step where the rounding changes
    # the float64 argmax or either float64 top-2 margin is within the tolerance.
    l64, l16, tol = oracle(cfg, P, PROMPT + ids32[:-1], dt, m)
    flip = (l64[p:].argmax(axis=1) != l16[p:].argmax(axis=1)) | (top2_gap(l64[p:]) <= tol) | \
        (top2_gap(l16[p:]) <= tol)
    safe = int(np.argmax(flip)) if flip.any() else N_NEW
    first = next((t for t in range(N_NEW) if ids16[t] != ids32[t]), None)
    print(f"{kind} {dt}: {'identical' if first is None else f'first differs at step {first}'}; "
          f"the rounding first changes the float64 pick (or meets a near-tie) at step {safe}")
    assert ids16[:safe] == ids32[:safe], (
        f"{kind} {dt}: the {dt} cache's ids differ from the F32 cache's at step {first}, before "
        f"the first step ({safe}) where the rounding can change the pick")
