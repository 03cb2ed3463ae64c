// `diffattn params`: parameters per component, attention FLOPs per token and KV-cache bytes per
// token for the standard, DIFF V1 and DIFF V2 versions of one model size, counted over the
// tensors of docs/FORMAT.md (include/diffattn/eval/accounting.h states the conventions).
#include <cmath>
#include <cstdio>
#include <iostream>

#include "cli/args.h"
#include "cli/table.h"
#include "diffattn/eval/accounting.h"
#include "diffattn/eval/exercises.h"

namespace diffattn::cli {

namespace {

std::string count(double n) {
  char buf[48];
  if (std::abs(n) >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.3fB", n / 1e9);
  } else if (std::abs(n) >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  } else if (std::abs(n) >= 1e4) {
    std::snprintf(buf, sizeof buf, "%.1fK", n / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", n);
  }
  return buf;
}

// FLOP counts with their unit: 15.36 GFLOP, 60.72 TFLOP, 233.47 KFLOP; below 1000 a whole
// number (FLOPs are counted, not measured).
std::string flops(double n) {
  char buf[48];
  if (n < 1e3) {
    std::snprintf(buf, sizeof buf, "%.0f FLOP", n);
    return buf;
  }
  const char* unit = n >= 1e12 ? "TFLOP" : n >= 1e9 ? "GFLOP" : n >= 1e6 ? "MFLOP" : "KFLOP";
  const double div = n >= 1e12 ? 1e12 : n >= 1e9 ? 1e9 : n >= 1e6 ? 1e6 : 1e3;
  std::snprintf(buf, sizeof buf, "%.2f %s", n / div, unit);
  return buf;
}

// Byte counts in binary units: 512.0 KiB.
std::string bytes_str(double n) {
  char buf[48];
  if (n >= 1048576) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", n / 1048576);
  } else if (n >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", n / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", n);
  }
  return buf;
}

std::string exact(int64_t n) {
  std::string s = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return (n < 0 ? "-" : "") + out;
}

std::string delta(int64_t n) { return n == 0 ? "0" : (n > 0 ? "+" : "-") + exact(n < 0 ? -n : n); }

std::string ratio(double a, double b) { return fixed(a / b, 3) + "x"; }

std::string shape_line(const model::ModelConfig& c) {
  const bool v1 = c.attention == nn::AttnKind::DiffV1, v2 = c.attention == nn::AttnKind::DiffV2;
  std::string s = std::to_string(c.n_layers) + " layers, ";
  if (v1) {
    s += std::to_string(c.n_heads) + " pairs of 2 x " + std::to_string(c.head_dim) +
         "-wide sub-heads, values " + std::to_string(2 * c.head_dim) + " wide, " +
         std::to_string(c.n_kv_heads) + " kv groups";
  } else if (v2) {
    s += std::to_string(2 * c.n_heads) + " query heads (" + std::to_string(c.n_heads) +
         " pairs) of " + std::to_string(c.head_dim) + ", " + std::to_string(c.n_kv_heads) + " kv heads";
  } else {
    s += std::to_string(c.n_heads) + " heads of " + std::to_string(c.head_dim) + ", " +
         std::to_string(c.n_kv_heads) + " kv heads";
  }
  return s + ", ffn " + std::to_string(c.ffn_dim);
}

void report(std::ostream& os, const std::string& title, const model::ModelConfig& b, int64_t T,
            double bytes, bool match_ffn) {
  model::ModelConfig bm = b;
  if (match_ffn) bm.ffn_dim = eval::v2_matched_ffn(b);
  const eval::Accounting st = eval::account(b, T, bytes);
  const eval::Accounting v1 = eval::account(eval::diff_v1_of(b), T, bytes);
  const eval::Accounting v2 = eval::account(eval::diff_v2_of(bm), T, bytes);
  os << "== " << title << " ==\n"
     << "d_model " << b.d_model << ", vocab " << b.vocab_size
     << (b.tie_embeddings ? " (tied embeddings)" : " (untied lm_head)") << "\n"
     << "  standard: " << shape_line(st.config) << "\n"
     << "  DIFF V1:  " << shape_line(v1.config) << "\n"
     << "  DIFF V2:  " << shape_line(v2.config)
     << (match_ffn ? "  (ffn shrunk to match the standard parameter count)" : "") << "\n\n";

  std::vector<std::vector<std::string>> rows;
  for (const char* comp : {"embeddings", "attention", "lambda", "norms", "ffn", "head"}) {
    auto get = [comp](const eval::Accounting& a) {
      auto it = a.params_by_component.find(comp);
      return it == a.params_by_component.end() ? int64_t{0} : it->second;
    };
    const std::string name = std::string(comp) == "attention" ? "attention projections" : comp;
    rows.push_back({name, exact(get(st)), exact(get(v1)), delta(get(v1) - get(st)), exact(get(v2)),
                    delta(get(v2) - get(st))});
  }
  rows.push_back({"total", exact(st.params), exact(v1.params), delta(v1.params - st.params),
                  exact(v2.params), delta(v2.params - st.params)});
  rows.push_back({"", count(st.params), count(v1.params), "", count(v2.params), ""});
  print_table(os, {"parameters", "standard", "DIFF V1", "V1 - std", "DIFF V2", "V2 - std"}, rows);

  os << "\nPer token, forward, 2 FLOPs per multiply-add; attention at context T = " << T
     << " (one query against " << T << " keys, all layers):\n";
  rows.clear();
  auto line = [&](const std::string& name, double s, double a, double c, bool is_flops) {
    auto f = [is_flops](double v) { return is_flops ? flops(v) : bytes_str(v); };
    rows.push_back({name, f(s), f(a), ratio(a, s), f(c), ratio(c, s)});
  };
  line("linear FLOPs (projections, FFN, head)", st.linear_flops_per_token, v1.linear_flops_per_token,
       v2.linear_flops_per_token, true);
  line("attention FLOPs (QK^T and PV)", st.attn_flops_per_token, v1.attn_flops_per_token,
       v2.attn_flops_per_token, true);
  line("total FLOPs", st.linear_flops_per_token + st.attn_flops_per_token,
       v1.linear_flops_per_token + v1.attn_flops_per_token,
       v2.linear_flops_per_token + v2.attn_flops_per_token, true);
  line("KV cache per token (all layers)", st.kv_cache_bytes_per_token, v1.kv_cache_bytes_per_token,
       v2.kv_cache_bytes_per_token, false);
  line("decode: K/V bytes read per cached token, fused", st.decode_read_bytes_fused,
       v1.decode_read_bytes_fused, v2.decode_read_bytes_fused, false);
  line("decode: same, one softmax pass per map", st.decode_read_bytes_two_pass,
       v1.decode_read_bytes_two_pass, v2.decode_read_bytes_two_pass, false);
  print_table(os, {"", "standard", "DIFF V1", "V1/std", "DIFF V2", "V2/std"}, rows);
  os << "(KV bytes at " << bytes << " bytes per value. A fused V1 kernel reads V once; the "
     << "recipe of one softmax pass per map reads it twice. V2 runs as one grouped-query call.)\n";
}

void exercise_five(std::ostream& os) {
  const eval::Exercise5 e = eval::exercise5();
  os << "== Textbook Exercise 5: \"6.8B DIFF = 11B standard\" in FLOPs (d_model 4096, "
     << e.context << " tokens) ==\n\n"
     << "The premise is the paper's claim (its model-size scaling fit, Ye et al. 2024), taken\n"
     << "as given, not verified here. Shapes of the 7B example (32 heads of 128, ffn 11008, vocab\n"
     << "32000); layers chosen so the parameter counts come closest to 6.8B and 11B.\n\n";
  std::vector<std::vector<std::string>> rows;
  auto row = [&](const std::string& name, const eval::Accounting& a, double seq) {
    rows.push_back({name, std::to_string(a.config.n_layers), count(a.params),
                    flops(a.linear_flops_per_token + a.attn_flops_per_token), flops(seq),
                    ratio(seq, e.standard_seq_flops)});
  };
  row("DIFF V1 \"6.8B\"", e.diff, e.diff_seq_flops);
  row("standard \"11B\"", e.standard, e.standard_seq_flops);
  row("standard twin of the DIFF model", e.diff_as_standard, e.twin_seq_flops);
  print_table(os, {"model", "layers", "params", "FLOPs/token at T=4096", "FLOPs, 4096-token seq",
                   "vs 11B"},
              rows);
  os << "\nForward FLOPs of a causal 4096-token sequence: DIFF " << flops(e.diff_seq_flops)
     << " against standard 11B " << flops(e.standard_seq_flops) << ": "
     << fixed(100.0 * (1.0 - e.diff_seq_flops / e.standard_seq_flops), 1)
     << "% fewer (training, about 3x forward, saves the same share). At equal size DIFF V1 costs "
     << fixed(100.0 * (e.diff_seq_flops / e.twin_seq_flops - 1.0), 1)
     << "% more than its standard twin: its value products are twice as wide.\n";
}

int run_params(const std::vector<std::string>& argv) {
  Args args("params",
            "Parameters per component, attention FLOPs per token and KV-cache bytes per token of\n"
            "the standard, DIFF V1 and DIFF V2 versions of one model size, counted over the\n"
            "tensors docs/FORMAT.md lists. Without size options: the 7B-class example of seed 001\n"
            "(hidden 4096, 32 heads of 128, 32 layers; vocab 32000 and ffn 11008 assumed, as in\n"
            "LLaMA-7B) with and without GQA (8 KV heads).");
  args.option("--model", "DIR", "", "a model directory (or its config.json; diffattn's or a Hugging Face Llama/DiffLlama one): its version and the other two")
      .option("--vocab", "N", "32000", "vocabulary size")
      .option("--d-model", "N", "4096", "hidden size")
      .option("--layers", "N", "32", "layers")
      .option("--heads", "N", "32", "attention heads of the standard model")
      .option("--kv-heads", "N", "", "key/value heads of the standard model (default: --heads)")
      .option("--head-dim", "N", "128", "head size of the standard model")
      .option("--ffn", "N", "11008", "FFN hidden size")
      .option("--context", "T", "4096",
              "context for attention FLOPs per token (with --model and no --context: the model's "
              "max_seq_len)")
      .option("--kv-bytes", "N", "2", "bytes per cached value (2: bf16/fp16; 4: float32)")
      .flag("--tie", "tie lm_head to the embedding table")
      .flag("--v2-match-ffn", "shrink V2's ffn to match the standard parameter count")
      .flag("--exercise5", "only the textbook's Exercise 5");
  if (!args.parse(argv)) return 0;
  if (args.on("--exercise5")) {
    exercise_five(std::cout);
    return 0;
  }
  constexpr int64_t kBig = int64_t{1} << 40;
  int64_t T = args.integer("--context", 1, kBig);
  const double bytes = args.number("--kv-bytes", 0.125, 64);
  const bool match = args.on("--v2-match-ffn");
  if (args.given("--model")) {
    for (const char* o : {"--vocab", "--d-model", "--layers", "--heads", "--head-dim", "--ffn",
                          "--kv-heads", "--tie"}) {
      if (args.given(o)) throw UsageError(std::string(o) + " cannot be used with --model (the size is the model's)");
    }
    const model::ModelConfig c = eval::read_model_config(args.str("--model"));
    if (!args.given("--context")) T = c.max_seq_len;
    report(std::cout, args.str("--model") + " (" + nn::attn_kind_name(c.attention) + ") and its other versions",
           eval::base_of(c), T, bytes, match);
    return 0;
  }
  model::ModelConfig b = eval::example_7b();
  b.vocab_size = args.integer("--vocab", 1, kBig);
  b.d_model = args.integer("--d-model", 1, kBig);
  b.n_layers = args.integer("--layers", 1, kBig);
  b.n_heads = args.integer("--heads", 1, kBig);
  b.head_dim = args.integer("--head-dim", 1, kBig);
  b.ffn_dim = args.integer("--ffn", 1, kBig);
  b.tie_embeddings = args.on("--tie");
  bool sized = false;
  for (const char* o : {"--vocab", "--d-model", "--layers", "--heads", "--head-dim", "--ffn",
                        "--kv-heads", "--tie"}) {
    sized |= args.given(o);
  }
  if (args.given("--kv-heads")) {
    b.n_kv_heads = args.integer("--kv-heads", 1, kBig);
  } else {
    b.n_kv_heads = b.n_heads;
  }
  if (sized) {
    report(std::cout, "Model size from the options", b, T, bytes, match);
    return 0;
  }
  report(std::cout, "Seed 001's 7B-class example, multi-head (32 KV heads)", b, T, bytes, match);
  std::cout << "\n";
  b.n_kv_heads = 8;
  report(std::cout, "The same with grouped-query attention (8 KV heads)", b, T, bytes, match);
  return 0;
}

const CommandRegistration reg({"params", "parameters, FLOPs and KV cache of standard, V1 and V2",
                               40, run_params});

}  // namespace

}  // namespace diffattn::cli
