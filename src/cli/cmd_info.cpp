// `diffattn info DIR`: a model directory's config, its tensors with their parameter counts,
// and lambda per layer.
#include <sys/stat.h>

#include <cmath>
#include <iostream>

#include "cli/args.h"
#include "cli/table.h"
#include "diffattn/infer/kv_store.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/train_context.h"
#include "diffattn/train/train.h"

namespace diffattn::cli {

namespace {

int run_info(const std::vector<std::string>& argv) {
  Args a("info", "Show a model directory: config, parameters per tensor, lambda per layer.");
  a.positional("DIR", "the model directory: diffattn's (config.json, model.safetensors) or a Hugging Face Llama/DiffLlama/Motif-2 one");
  if (!a.parse(argv)) return 0;
  const std::string dir = a.str("DIR");
  const model::ModelDir md = model::open_model_dir(dir);
  const model::Model m = model::load_model(md);
  const model::ModelConfig& c = m.config();
  // A Hugging Face directory may come without its tokenizer: say so rather than refuse to show it.
  std::unique_ptr<data::Tokenizer> tok;
  std::string tokenizer;
  if (md.hf && md.tokenizer_path.empty()) {
    tokenizer = "no tokenizer: generating needs its tokenizer.json, or --tokenizer bytes";
    tok = data::byte_tokenizer();  // for the V2 lambda sample below (a V2 model is diffattn's own)
  } else {
    tok = data::tokenizer_for(md);
    tokenizer = tok->name() + " tokenizer";
  }
  std::cout << "model " << dir << " (" << tokenizer << ")\nweights: " << m.storage()
            << "\n\nconfig (diffattn's form)\n" << c.to_json() << "\n";
  std::vector<std::vector<std::string>> rows;
  for (const model::TensorInfo& t : m.tensors()) {
    rows.push_back({t.name, shape_str(t.shape), std::to_string(t.numel), t.decay ? "yes" : "no"});
  }
  rows.push_back({"total", "", std::to_string(m.num_params()), ""});
  print_table(std::cout, {"tensor", "shape", "parameters", "weight decay"}, rows);
  if (c.noise_share > 1) {
    // grouped differential attention: each shared noise query head is held once per pair
    const int64_t groups = c.n_heads / c.noise_share;
    const int64_t copies = c.n_layers * (c.n_heads - groups) * c.head_dim * c.d_model;
    std::cout << "noise heads shared by " << c.noise_share << " pairs (" << groups
              << " a layer): q_proj holds each once per pair, " << copies
              << " of the parameters above are those copies (" << m.num_params() - copies
              << " distinct)\n";
  }

  // What one sequence holds at a few context lengths (infer::KvStore's arithmetic; a SambaY
  // model's Mamba states and windows are allocated whole when the sequence opens).
  std::vector<std::vector<std::string>> mrows;
  for (const int64_t n : {int64_t{4096}, int64_t{32768}, int64_t{131072}}) {
    auto mib = [&](DType t) { return fixed(infer::KvStore::sequence_bytes(c, n, t) / 1048576.0); };
    mrows.push_back({std::to_string(n), mib(DType::F32), mib(DType::BF16)});
  }
  std::cout << "\nstate bytes per sequence (" << (c.recurrent() ? "K/V of one layer, Mamba states, sliding windows" : "K/V of every layer") << "), MiB\n";
  print_table(std::cout, {"context", "KV f32", "KV bf16"}, mrows);
  if (c.attention == nn::AttnKind::Standard) {
    std::cout << "\nlambda: none (standard attention)\n";
    return 0;
  }
  std::vector<std::vector<std::string>> lrows;
  if (c.attention == nn::AttnKind::DiffV1) {
    const std::vector<double> lam = m.layer_lambdas();
    for (int64_t l = 0; l < c.n_layers; ++l) {
      if (c.recurrent() && std::isnan(lam[static_cast<size_t>(l)])) continue;  // Mamba, GMU
      lrows.push_back({std::to_string(l), fixed(c.layer_lambda_init(l)), fixed(lam[static_cast<size_t>(l)])});
    }
    std::cout << "\nlambda per layer (Eq. 2: exp(lq1.lk1) - exp(lq2.lk2) + lambda_init)\n";
    print_table(std::cout, {"layer", "lambda_init", "lambda"}, lrows);
  } else {
    // V2's lambda is per token: show its mean over a fixed sample sentence.
    const std::string sample = "In the beginning God created the heaven and the earth.";
    std::vector<int32_t> ids = tok->encode(sample);
    if (static_cast<int64_t>(ids.size()) > c.max_seq_len) ids.resize(static_cast<size_t>(c.max_seq_len));
    model::TrainContext run(m);
    run.forward(ids.data(), nullptr, 1, static_cast<int64_t>(ids.size()));
    const std::vector<double> lam = run.layer_lambdas();
    for (int64_t l = 0; l < c.n_layers; ++l) lrows.push_back({std::to_string(l), fixed(lam[static_cast<size_t>(l)])});
    std::cout << "\nlambda per layer: sigmoid(lambda_proj x), mean over the tokens and heads of \""
              << sample << "\"\n";
    print_table(std::cout, {"layer", "mean lambda"}, lrows);
  }
  return 0;
}

const CommandRegistration reg({"info", "show a model: config, parameters per tensor, lambda per layer", 14,
                               run_info});

}  // namespace

}  // namespace diffattn::cli
