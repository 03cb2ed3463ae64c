"""The paired language-model experiment (bench/gpu_experiment.py) end to end at a tiny size on
the CPU, its pairing, its SDPA recipe against the operator, and the corpus split
(scripts/corpus.py) on stand-in sources."""

import importlib.util
import json
import os

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(rel, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gx = _load("bench/gpu_experiment.py", "gpu_experiment")
corpus = _load("scripts/corpus.py", "corpus_script")

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
         "boxing matches and python parses json files").split()


def _fake_corpus(path, n_train=12, n_held=4, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    for name, n in (("train.jsonl", n_train), ("heldout.jsonl", n_held)):
        with open(os.path.join(path, name), "w") as f:
            for i in range(n):
                text = " ".join(rng.choice(WORDS, size=int(rng.integers(40, 120)))) + "\n"
                f.write(json.dumps({"source": "fake", "id": f"{name}-{i}", "text": text}) + "\n")
    return path


def test_paired_init_shares_every_common_tensor():
    cfgs = {k: gx.model_config(k, 32, 2, 4, 88, 64) for k in gx.KINDS}
    from diffattn.torch import DiffTransformerLM
    models = {}
    for k in gx.KINDS:
        models[k] = DiffTransformerLM(cfgs[k])
        gx.paired_init(models[k], 7)
    shared = gx.check_pairing(models)
    p = {k: dict(m.named_parameters()) for k, m in models.items()}
    # what the three share: embeddings, norms, K/V/out projections; V1 and standard: the SwiGLU
    for n in ("embed_tokens.weight", "layers.1.attn.k_proj.weight", "layers.0.attn.v_proj.weight",
              "layers.1.attn.out_proj.weight", "layers.0.attn_norm.weight", "norm.weight"):
        assert torch.equal(p["diff_v1"][n], p["standard"][n]), n
        assert torch.equal(p["diff_v2"][n], p["standard"][n]), n
    assert torch.equal(p["diff_v1"]["layers.0.ffn.up_proj.weight"],
                       p["standard"]["layers.0.ffn.up_proj.weight"])
    assert torch.equal(p["diff_v1"]["layers.0.attn.q_proj.weight"],
                       p["standard"]["layers.0.attn.q_proj.weight"])  # V1: same H*D query rows
    assert shared >= 2 * 9 + 2
    # equal sizes (V2's SwiGLU pays for its extra queries and lambda projection)
    n = {k: sum(t.numel() for t in m.parameters()) for k, m in models.items()}
    assert abs(n["diff_v2"] - n["standard"]) <= 3 * 32 and 0 <= n["diff_v1"] - n["standard"] < 200
    # another seed draws other weights; a changed byte is caught
    other = DiffTransformerLM(cfgs["standard"])
    gx.paired_init(other, 8)
    assert not torch.equal(dict(other.named_parameters())["embed_tokens.weight"],
                           p["standard"]["embed_tokens.weight"])
    with torch.no_grad():
        p["diff_v2"]["layers.0.attn.k_proj.weight"][0, 0] += 1e-6
    with pytest.raises(AssertionError, match="k_proj"):
        gx.check_pairing(models)


def test_sdpa_recipe_matches_the_operator():
    import diffattn.torch as dt
    g = torch.Generator().manual_seed(0)
    B, T, H, D = 2, 9, 2, 8
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q, k1, v1 = r(B, T, 2 * H, D), r(B, T, 2 * H, D), r(B, T, H, 2 * D)   # V1: own keys per map
    lam = torch.tensor([0.3])
    torch.testing.assert_close(gx.sdpa_diff_attention(q, k1, v1, lam),
                               dt.diff_attention(q, k1, v1, lam, causal=True),
                               atol=1e-5, rtol=1e-5)
    k2, v2, lam2 = r(B, T, 1, D), r(B, T, 1, D), torch.rand(B, T, H, generator=g)  # V2, GQA
    torch.testing.assert_close(gx.sdpa_diff_attention(q, k2, v2, lam2),
                               dt.diff_attention(q, k2, v2, lam2, causal=True),
                               atol=1e-5, rtol=1e-5)
    qs = r(B, T, H, D)
    torch.testing.assert_close(gx.sdpa_attention(qs, k2, v2), dt.attention(qs, k2, v2, causal=True),
                               atol=1e-5, rtol=1e-5)


def test_t_interval_and_buckets():
    c = gx.t_interval([1.0, 2.0, 3.0])
    assert c["mean"] == 2.0 and c["lo"] == pytest.approx(2 - 4.303 / np.sqrt(3))
    assert np.isnan(gx.t_interval([1.0])["lo"])
    assert gx.t975(1000) == pytest.approx(1.962, abs=1e-3)
    assert gx.position_buckets(1024) == [(0, 8), (8, 64), (64, 256), (256, 1024)]
    assert gx.position_buckets(64) == [(0, 8), (8, 64)]
    a = gx.batch_starts(3, 5, 4, 1000, 64)
    assert np.array_equal(a, gx.batch_starts(3, 5, 4, 1000, 64)) and a.max() < 1000 - 65


def test_tiny_run_end_to_end(tmp_path):
    torch.set_num_threads(1)
    data = _fake_corpus(str(tmp_path / "corpus"))
    out = str(tmp_path / "run")
    r = gx.main(["--tiny", "--corpus", data, "--out", out, "--steps", "4", "--warmup", "1",
                 "--eval-windows", "1", "--d-model", "16", "--ffn-dim", "40", "--seq-len", "32",
                 "--device", "cpu"])
    with open(os.path.join(out, "report.json")) as f:
        rep = json.load(f)
    assert rep["steps"] == 4 and rep["tokens_per_model"] == 4 * 4 * 32
    assert [s["seed"] for s in rep["seeds"]] == [1, 2, 3]
    assert rep["pairing"]["identical"] and rep["pairing"]["shared_tensors"] > 0
    assert len({s["data_order_sha256"] for s in rep["seeds"]}) == 3
    for s in rep["seeds"]:
        for k in gx.KINDS:
            m = s["models"][k]
            assert len(m["loss_curve"]) == 4 and np.all(np.isfinite(m["loss_curve"]))
            assert len(m["doc_loss"]) == 4 and np.isfinite(m["loss_doc_mean"])
            assert len(m["lambdas"]) == (2 if k != "standard" else 0)
        assert all(0 < x < 1 for x in s["models"]["diff_v2"]["lambdas"])
    assert [(p["a"], p["b"]) for p in rep["paired"]] == list(gx.PAIRS)
    for p in rep["paired"]:
        for c in p["per_seed"] + [p["pooled"], p["across_seeds"]] + p["by_bucket"]:
            assert c["lo"] <= c["mean"] <= c["hi"]
        assert len(p["by_bucket"]) == len(rep["buckets"]) == 2
        # the pooled interval is over documents of the seed-averaged differences
        per_doc = np.mean([np.array(s["models"][p["a"]]["doc_loss"])
                           - np.array(s["models"][p["b"]]["doc_loss"]) for s in rep["seeds"]], 0)
        assert p["pooled"]["mean"] == pytest.approx(per_doc.mean())
    md = open(os.path.join(out, "report.md")).read()
    for h in ("## Scale and budget", "## Held-out loss", "## Paired differences",
              "## Loss by position bucket", "## Lambda per layer",
              "## What these numbers do and do not show", "its numbers mean nothing"):
        assert h in md
    for svg in ("loss_by_position.svg", "training_loss.svg"):
        assert open(os.path.join(out, svg)).read().startswith("<svg")
    # seeded: the same seed trains to the same losses
    r2 = gx.main(["--tiny", "--corpus", data, "--out", str(tmp_path / "run2"), "--steps", "4",
                  "--warmup", "1", "--eval-windows", "1", "--d-model", "16", "--ffn-dim", "40",
                  "--seq-len", "32", "--device", "cpu", "--seeds", "2"])
    assert r2["seeds"][0]["models"]["diff_v1"]["loss_curve"] == \
        r["seeds"][1]["models"]["diff_v1"]["loss_curve"]


def test_errors(tmp_path):
    with pytest.raises(SystemExit, match="not found"):
        gx.main(["--tiny", "--corpus", str(tmp_path / "none"), "--out", str(tmp_path / "o")])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text('{"source": "a"}\n')
    (bad / "heldout.jsonl").write_text("")
    with pytest.raises(SystemExit, match="line 1"):
        gx.main(["--tiny", "--corpus", str(bad), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit):
        gx.parse(["--tiny", "--seeds", "1,1"])


def test_corpus_split_by_document(tmp_path, monkeypatch):
    docs = {"alpha": [(f"a{i}", f"text {i} " * 40) for i in range(300)],
            "beta": [(f"b{i}", "short") if i % 10 == 0 else (f"b{i}", "y" * 300)
                     for i in range(100)]}
    monkeypatch.setattr(corpus, "READERS", {k: (lambda v=v: iter(v)) for k, v in docs.items()})
    monkeypatch.setattr(corpus, "SOURCES", {k: {"package": "none", "licence": "test"}
                                            for k in docs})
    m = corpus.build(str(tmp_path / "c"), ["alpha", "beta"], 10.0)
    read = lambda n: [json.loads(l) for l in open(tmp_path / "c" / n)]  # noqa: E731,E741
    train, held = read("train.jsonl"), read("heldout.jsonl")
    ids_t = {(d["source"], d["id"]) for d in train}
    ids_h = {(d["source"], d["id"]) for d in held}
    assert not ids_t & ids_h and len(ids_t) + len(ids_h) == 300 + 90
    assert m["sources"]["beta"]["skipped_short"] == 10
    assert 0.05 < len(ids_h) / 390 < 0.16  # about 10%
    assert all(corpus.held_out(s, i, 10.0) for s, i in ids_h)
    m2 = corpus.build(str(tmp_path / "c2"), ["beta", "alpha"], 10.0)   # order of sources
    ids_h2 = {(d["source"], d["id"]) for d in
              (json.loads(l) for l in open(tmp_path / "c2" / "heldout.jsonl"))}  # noqa: E741
    assert ids_h2 == ids_h and m2["heldout_documents"] == m["heldout_documents"]
    assert set(os.listdir(tmp_path / "c")) == {"train.jsonl", "heldout.jsonl", "manifest.json"}


def test_bf16_autocast_and_budget_fit(tmp_path):
    """The GPU path's dtype flow (BF16 autocast into the operators; on the CPU they compute in
    float32) and the budget fit: a budget too small for the requested steps lowers the steps
    of every model alike, down to warmup + 1."""
    torch.set_num_threads(1)
    data = _fake_corpus(str(tmp_path / "corpus"), n_train=4, n_held=2)
    r = gx.main(["--tiny", "--corpus", data, "--out", str(tmp_path / "run"), "--steps", "50",
                 "--warmup", "1", "--eval-windows", "1", "--d-model", "16", "--ffn-dim", "40",
                 "--seq-len", "32", "--device", "cpu", "--seeds", "1", "--bf16",
                 "--budget-minutes", "0.001"])
    assert r["options"]["bf16"] and r["steps"] == 2 and r["options"]["steps"] == 50
    for k in gx.KINDS:
        assert len(r["seeds"][0]["models"][k]["loss_curve"]) == 2
        assert np.isfinite(r["seeds"][0]["models"][k]["loss_doc_mean"])
    assert "lowered to fit 0.001 min" in open(tmp_path / "run" / "report.md").read()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs Triton's interpreter (conftest sets it without a GPU)")
def test_triton_path_trains_as_the_cpp_kernels(tmp_path):
    """The attention path a GPU run takes (the Triton kernels, here interpreted on the CPU) at
    the model's shapes gives the losses of the C++ kernels' path within float32 rounding."""
    from diffattn.torch import models, ops
    torch.set_num_threads(1)
    data = _fake_corpus(str(tmp_path / "corpus"), n_train=4, n_held=2)
    args = ["--tiny", "--corpus", data, "--steps", "2", "--warmup", "1", "--eval-windows", "1",
            "--d-model", "64", "--ffn-dim", "64", "--seq-len", "32", "--n-layers", "1",
            "--batch", "2", "--device", "cpu", "--seeds", "1"]
    saved = models.attention, models.diff_attention
    try:
        rt = gx.main(args + ["--attention", "triton", "--out", str(tmp_path / "t")])
    finally:
        models.attention, models.diff_attention = saved
    assert models.diff_attention is ops.diff_attention
    rc = gx.main(args + ["--attention", "ops", "--out", str(tmp_path / "c")])
    assert rt["attention"] == "triton"
    for k in gx.KINDS:
        a, b = rt["seeds"][0]["models"][k], rc["seeds"][0]["models"][k]
        np.testing.assert_allclose(a["loss_curve"], b["loss_curve"], rtol=1e-4)
        np.testing.assert_allclose(a["doc_loss"], b["doc_loss"], rtol=1e-4)


def test_cli_experiment_lm(tmp_path):
    """`diffattn experiment lm` end to end at a tiny size, and its refusals."""
    import model_helpers as mh
    data = _fake_corpus(str(tmp_path / "corpus"), n_train=6, n_held=3)
    out = tmp_path / "lm"
    p = mh.run_cli("--threads", 1, "experiment", "lm", "--corpus", data, "--out", out,
                   "--steps", 3, "--batch", 2, "--seq-len", 16, "--d-model", 16, "--heads", 2,
                   "--ffn", 40, "--eval-windows", 1, "--seeds", "4,5,6")
    assert "95% interval over documents" in p.stdout
    rep = json.load(open(out / "report.json"))
    assert [s["seed"] for s in rep["seeds"]] == [4, 5, 6] and rep["pairing"]["shared_tensors"] > 0
    assert len(rep["paired"]) == 3 and len(rep["corpus"]["heldout_ids"]) == 3
    assert (out / "loss_by_position.png").exists() and (out / "training_loss.png").exists()
    p = mh.run_cli("experiment", "lm", "--corpus", tmp_path / "none", "--out", out, check=False)
    assert p.returncode == 1 and "train.jsonl not found" in p.stderr
    p = mh.run_cli("experiment", "lm", "--corpus", data, "--seeds", "1,1", check=False)
    assert p.returncode == 2 and "given twice" in p.stderr
