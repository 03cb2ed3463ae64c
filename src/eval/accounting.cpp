// Accounting (accounting.h) over FORMAT.md's tensor list.
#include "diffattn/eval/accounting.h"

#include <cmath>

namespace diffattn::eval {

namespace {

void need(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument("model config: " + what);
}

}  // namespace

model::ModelConfig example_7b() {
  model::ModelConfig c;
  c.attention = nn::AttnKind::Standard;
  c.vocab_size = 32000;
  c.d_model = 4096;
  c.n_layers = 32;
  c.n_heads = 32;
  c.n_kv_heads = 32;
  c.head_dim = 128;
  c.ffn_dim = 11008;
  c.max_seq_len = 4096;
  return c;
}

model::ModelConfig diff_v1_of(const model::ModelConfig& b) {
  need(b.n_heads % 2 == 0, "DIFF V1 pairs two heads of the standard model: n_heads must be even, got " +
                               std::to_string(b.n_heads));
  need(b.n_kv_heads % 2 == 0,
       "DIFF V1 keeps the key/value size with half as many groups of 2D-wide values: n_kv_heads "
       "must be even, got " + std::to_string(b.n_kv_heads));
  model::ModelConfig c = b;
  c.attention = nn::AttnKind::DiffV1;
  c.n_heads = b.n_heads / 2;  // h = d_model / 2d (arXiv:2410.05258, Section 2.1)
  c.n_kv_heads = b.n_kv_heads / 2;
  return c;
}

model::ModelConfig diff_v2_of(const model::ModelConfig& b) {
  model::ModelConfig c = b;
  c.attention = nn::AttnKind::DiffV2;
  return c;
}

int64_t v2_matched_ffn(const model::ModelConfig& b) {
  return model::v2_matched_ffn_dim(b.ffn_dim, b.d_model, b.n_heads, b.head_dim);
}

model::ModelConfig base_of(const model::ModelConfig& c) {
  model::ModelConfig b = c;
  b.attention = nn::AttnKind::Standard;
  b.lambda_init.reset();
  if (c.attention == nn::AttnKind::DiffV1) {
    b.n_heads = 2 * c.n_heads;
    b.n_kv_heads = 2 * c.n_kv_heads;
  }
  return b;
}

// FORMAT.md's tensor list is tensor_table (src/model/config.cpp), the one the model loads and
// saves; accounting only adds each tensor's component.
std::vector<TensorSpec> format_tensors(const model::ModelConfig& c) {
  auto component = [](const std::string& n) -> std::string {
    auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
    if (has("embed_tokens")) return "embeddings";
    if (has("lm_head")) return "head";
    if (has("norm.weight") || has("subln")) return "norms";
    if (has(".bias")) return has(".attn.") ? "attention" : "ffn";
    if (has("lambda")) return "lambda";
    if (has(".attn.")) return "attention";
    return "ffn";
  };
  std::vector<TensorSpec> t;
  model::ModelConfig v = c;
  if (v.max_seq_len < 1) v.max_seq_len = 1;  // no tensor depends on it
  v.validate("model config");
  for (const model::TensorInfo& i : model::tensor_table(v)) t.push_back({i.name, i.shape, component(i.name)});
  return t;
}

Accounting account(const model::ModelConfig& c, int64_t context, double bytes_per_value) {
  if (context < 1) throw InvalidArgument("accounting: context must be >= 1, got " + std::to_string(context));
  if (!(bytes_per_value > 0) || !std::isfinite(bytes_per_value)) {
    throw InvalidArgument("accounting: bytes per value must be a finite number > 0");
  }
  Accounting a;
  a.config = c;
  for (const TensorSpec& t : format_tensors(c)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    a.params_by_component[t.component] += n;
    a.params += n;
    // Matrices a token is multiplied by (2-D weights other than the embedding table).
    if (t.shape.size() == 2 && t.component != "embeddings") a.linear_flops_per_token += 2.0 * n;
  }
  if (c.tie_embeddings) a.linear_flops_per_token += 2.0 * c.vocab_size * c.d_model;
  const bool v1 = c.attention == nn::AttnKind::DiffV1, v2 = c.attention == nn::AttnKind::DiffV2;
  const double H = c.n_heads, G = c.n_kv_heads, D = c.head_dim, L = c.n_layers;
  const double Dv = v1 ? 2 * D : D;
  const double maps = (v1 || v2) ? 2 : 1;
  // Per key, per layer: each map of each head does one q.k (D multiply-adds) and one p*v row
  // (Dv multiply-adds).
  a.attn_flops_per_key = L * H * maps * 2.0 * (D + Dv);
  a.attn_flops_per_token = a.attn_flops_per_key * static_cast<double>(context);
  const double key_heads = v1 ? 2 * G : G;
  const double k_bytes = L * key_heads * D * bytes_per_value, v_bytes = L * G * Dv * bytes_per_value;
  a.kv_cache_bytes_per_token = k_bytes + v_bytes;
  a.decode_read_bytes_fused = k_bytes + v_bytes;
  // The V1 recipe of two softmax passes (one per map) reads each map's keys once and the values
  // twice. V2 runs as one grouped-query call (its 2H query heads share the G key/value heads),
  // and standard attention as one call: both read the cache once.
  a.decode_read_bytes_two_pass = v1 ? k_bytes + 2 * v_bytes : k_bytes + v_bytes;
  return a;
}

double sequence_flops(const Accounting& a, int64_t T) {
  const double t = static_cast<double>(T);
  return t * a.linear_flops_per_token + a.attn_flops_per_key * t * (t + 1) / 2;
}

}  // namespace diffattn::eval

#include <cmath>
#include <sys/stat.h>

#include "diffattn/base/files.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/config.h"

namespace diffattn::eval {

model::ModelConfig read_model_config(const std::string& path) {
  struct stat st {};
  const bool dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (dir || path.empty() || path.back() == '/') model::check_model_dir(path);  // worded as load_model's
  const std::string file = dir ? path + "/config.json" : path;
  const std::string text = read_file(file, kMaxJsonFileBytes);
  // config.json has one parser per format, the model loader's (every rule and error message).
  if (dir && model::is_hf_model_dir(path)) return model::hf_model_config(text, file);
  return model::ModelConfig::from_json(text, file);
}

}  // namespace diffattn::eval
