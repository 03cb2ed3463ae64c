// `diffattn maps`: the attention maps of a trained model on a prompt, recomputed from the saved
// statistics of the fused forward (src/eval/inspect.cpp), written as PNG heatmaps and .npy.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>

#include "cli/args.h"
#include "cli/table.h"
#include "diffattn/eval/inspect.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/train_context.h"
#include "diffattn/train/train.h"
#include "diffattn/viz/viz.h"

namespace diffattn::cli {

namespace {

// The prompt's tokens and a label for each (its text).
struct Prompt {
  std::vector<int32_t> ids;
  std::vector<std::string> labels;
};

Prompt tokenize(const data::Tokenizer& tok, const std::string& text, int64_t max_len) {
  Prompt p;
  p.ids = tok.encode(text);
  if (p.ids.empty()) throw UsageError("--prompt is empty");
  if (static_cast<int64_t>(p.ids.size()) > max_len) {
    throw UsageError("--prompt is " + plural(static_cast<long long>(p.ids.size()), "token") + "; the model takes at most max_seq_len = " +
                     std::to_string(max_len));
  }
  for (int32_t id : p.ids) p.labels.push_back(tok.decode({id}));
  return p;
}

// The keys a row weighs most, as "token@pos weight" strings.
std::string top_keys(const std::vector<float>& m, int64_t T, int64_t row, const std::vector<std::string>& labels, int k) {
  std::vector<int64_t> idx(static_cast<size_t>(row + 1));
  std::iota(idx.begin(), idx.end(), 0);
  const float* w = &m[static_cast<size_t>(row * T)];
  std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return std::abs(w[a]) > std::abs(w[b]); });
  std::string s;
  for (int i = 0; i < k && i < static_cast<int>(idx.size()); ++i) {
    const int64_t j = idx[static_cast<size_t>(i)];
    s += (i ? "  " : "") + viz::display_label(labels[static_cast<size_t>(j)], 8) + "@" + std::to_string(j) + " " +
         fixed(w[j], 3);
  }
  return s;
}

int run_maps(const std::vector<std::string>& argv) {
  Args a("maps",
         "Attention maps of a trained model on a prompt: map 1, map 2, the signed map A1 - lambda A2\n"
         "and the standard view of a DIFF model (V1, V2), or the one softmax map of a standard\n"
         "model, as PNG heatmaps with token labels and as .npy arrays (T x T, row = query).\n"
         "The maps are recomputed from the saved log-sum-exp of the model's fused forward; the\n"
         "forward itself keeps no T x T buffer.\n"
         "\"Standard view\" of a DIFF pair: its full-width scores as one standard head,\n"
         "softmax([q1;q2].[k1;k2] / sqrt(2D)), the textbook's standard view (V2 shares one key\n"
         "head between the maps: k1 = k2 = k). For a standard model it is its own map.\n"
         "Lambda: V1 the layer's learned lambda; V2 sigmoid(lambda_proj x) of each query token.");
  a.option("--model", "DIR", "", "model directory (required)")
      .option("--prompt", "TEXT", "", "text to run through the model (required)")
      .option("--layer", "L", "-1", "layer (0-based; -1: the last)")
      .option("--head", "H", "0", "pair (DIFF) or head (standard), 0-based")
      .flag("--mean-heads", "average over the layer's heads instead of one head")
      .flag("--mean-layers", "average over every layer (of --head, or of the head mean)")
      .option("--lambda", "X", "", "use lambda X for the differential map instead of the learned one")
      .option("--mode", "MODE", "signed", "signed (the paper) or clamp (the textbook's renormalised clamp)")
      .option("--out", "DIR", "maps", "directory for the PNG and .npy files")
      .option("--tokenizer", "WHICH", "model",
              "model: the directory's tokenizer (a Hugging Face directory must have one); bytes: raw "
              "bytes as token ids");
  if (!a.parse(argv)) return 0;
  if (!a.given("--model")) throw UsageError("--model DIR is required");
  if (!a.given("--prompt")) throw UsageError("--prompt TEXT is required");
  const std::string dir = a.str("--model");
  // The flags that need no model first: a bad one is a usage error whatever DIR holds.
  const data::TokenizerChoice choice =
      from_flags([&] { return data::parse_tokenizer_choice(a.str("--tokenizer"), "--tokenizer"); });
  eval::MapOptions mo;
  if (a.given("--lambda")) mo.lambda = a.number("--lambda");
  mo.mode = from_flags([&] { return kernels::parse_diff_mode(a.str("--mode"), "--mode"); });
  int64_t layer = a.integer("--layer");
  const int64_t head_flag = a.integer("--head");
  const model::ModelDir md = model::open_model_dir(dir);
  const model::Model m = model::load_model(md);
  const auto tok = data::tokenizer_for(md, choice);
  const Prompt p = tokenize(*tok, a.str("--prompt"), m.config().max_seq_len);
  const int64_t T = static_cast<int64_t>(p.ids.size()), L = m.config().n_layers;
  if (layer == -1) layer = L - 1;
  if (layer < 0 || layer >= L) {
    throw UsageError("--layer " + std::to_string(layer) + " is outside [0, " + std::to_string(L) + ")");
  }
  const int64_t heads = m.config().n_heads;
  int64_t head = a.on("--mean-heads") ? -1 : head_flag;
  if (head < -1 || head >= heads) {
    throw UsageError("--head " + std::to_string(head) + " is outside [0, " + std::to_string(heads) + ")");
  }
  model::TrainContext run(m);
  run.forward(p.ids.data(), nullptr, 1, T);

  const std::string kind = nn::attn_kind_name(m.config().attention);
  const std::string who = head < 0 ? std::string("mean of ") + std::to_string(heads) + " heads"
                                   : std::string("head ") + std::to_string(head);
  eval::AttentionViews v;
  std::string stem;
  if (a.on("--mean-layers")) {
    std::vector<eval::AttentionViews> per;
    for (int64_t l = 0; l < L; ++l) per.push_back(eval::head_views(eval::layer_maps(run, l, 0, mo), head, p.labels));
    v = eval::mean_views(per);
    v.title = kind + " model, mean of " + std::to_string(L) + " layers, " + who;
    stem = head < 0 ? "mean_layers_mean_heads" : "mean_layers_head" + std::to_string(head);
  } else {
    v = eval::head_views(eval::layer_maps(run, layer, 0, mo), head, p.labels);
    v.title = kind + " model, layer " + std::to_string(layer) + ", " + who;
    stem = "layer" + std::to_string(layer) + (head < 0 ? "_mean_heads" : "_head" + std::to_string(head));
  }
  v.mode = mo.mode;
  const std::string out = a.str("--out");
  const std::vector<std::string> written = eval::export_views(v, out, stem);

  std::cout << v.title << ", " << plural(T, "token");
  if (!v.map1.empty()) {
    std::cout << ", lambda " << fixed(v.lambda, 3) << (a.given("--lambda") ? " (given)" : v.lambda_varies ? " (mean; per token)" : " (learned)");
  }
  std::cout << "\nThe last token's row (the keys it weighs most, |weight|):\n";
  std::vector<std::vector<std::string>> rows;
  auto add = [&](const char* name, const std::vector<float>& mat) {
    if (!mat.empty()) rows.push_back({name, top_keys(mat, T, T - 1, p.labels, 4)});
  };
  add("map 1", v.map1);
  add("map 2", v.map2);
  add("A1 - lambda A2", v.diff);
  add(v.map1.empty() ? "softmax" : "standard view", v.standard);
  print_table(std::cout, {"view", "top keys"}, rows);
  std::cout << "\nwrote " << written.size() << " files into " << out << "/:\n";
  for (const std::string& w : written) std::cout << "  " << w << "\n";
  return 0;
}

const CommandRegistration reg({"maps", "attention maps of a trained model on a prompt (PNG + .npy)", 14,
                               run_maps});

}  // namespace

}  // namespace diffattn::cli
