"""Helpers for the `diffattn serve` tests: a tiny random model over bytes whose greedy output is
printable ASCII (so served text and `diffattn generate`'s output compare as strings), and a server
process on a free loopback port."""

import subprocess


import model_helpers as mh
import torch_model as tm


def write_ascii_model(path, kind="diff_v1", seed=0, max_seq_len=256, d_model=48, n_layers=2, ffn_dim=96,
                      n_heads=None, n_kv_heads=None, head_dim=12):
    """Random weights over the byte tokenizer; lm_head rows of bytes outside printable ASCII are
    zero, so their logit is 0 while the largest of the 95 random printable logits is positive:
    greedy decoding writes printable ASCII only."""
    cfg = {"format": "diffattn/1", "attention": kind, "vocab_size": 256, "d_model": d_model,
           "n_layers": n_layers, "n_heads": n_heads or (4 if kind == "standard" else 2),
           "n_kv_heads": n_kv_heads or (2 if kind == "standard" else 1), "head_dim": head_dim,
           "ffn_dim": ffn_dim,
           "max_seq_len": max_seq_len, "rope_theta": 10000.0, "norm_eps": 1e-5,
           "tie_embeddings": False}
    w = tm.random_weights(cfg, seed, std=0.1, lam_std=0.3, gain_std=0.3)
    head = w["lm_head.weight"]
    head[:32] = 0
    head[127:] = 0
    head[32:127] *= 10  # decisive margins: argmax does not hinge on rounding
    return tm.save_model_dir(path, cfg, w)


# Meta-Llama-3-8B-Instruct's chat_template (tokenizer_config.json), for when the real file is not
# beside the repository.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


class Server:
    """`diffattn serve --model DIR --port 0 ARGS` until stop(); url is http://127.0.0.1:PORT."""

    def __init__(self, model, *args):
        self.proc = subprocess.Popen([mh.CLI, "--threads", "1", "serve", "--model", str(model),
                                      "--port", "0", *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.proc.stdout.readline().decode()
        if "listening on" not in line:
            self.proc.kill()
            raise AssertionError(f"the server did not start: {line} {self.proc.stderr.read().decode()}")
        self.port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the server did not stop within 15 s of SIGTERM")
        assert code == 0, f"the server exited {code}: {self.proc.stderr.read().decode()}"
