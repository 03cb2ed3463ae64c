// Accounting (accounting.h) over FORMAT.md's tensor list.
#include "diffattn/accounting.h"

namespace diffattn {

namespace {

void need(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument("model config: " + what);
}

void check(const ArchConfig& c) {
  need(c.attention == "standard" || c.attention == "diff_v1" || c.attention == "diff_v2",
       "attention must be \"standard\", \"diff_v1\" or \"diff_v2\", got \"" + c.attention + "\"");
  need(c.vocab_size > 0, "vocab_size must be > 0, got " + std::to_string(c.vocab_size));
  need(c.d_model > 0, "d_model must be > 0, got " + std::to_string(c.d_model));
  need(c.n_layers > 0, "n_layers must be > 0, got " + std::to_string(c.n_layers));
  need(c.ffn_dim > 0, "ffn_dim must be > 0, got " + std::to_string(c.ffn_dim));
  need(c.n_heads > 0, "n_heads must be > 0, got " + std::to_string(c.n_heads));
  need(c.head_dim > 0, "head_dim must be > 0, got " + std::to_string(c.head_dim));
  need(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0,
       "n_kv_heads (" + std::to_string(c.n_kv_heads) + ") must divide n_heads (" +
           std::to_string(c.n_heads) + ")");
}

}  // namespace

ArchConfig standard_of(const BaseSize& b) {
  ArchConfig c;
  c.attention = "standard";
  c.vocab_size = b.vocab_size;
  c.d_model = b.d_model;
  c.n_layers = b.n_layers;
  c.ffn_dim = b.ffn_dim;
  c.n_heads = b.n_heads;
  c.n_kv_heads = b.n_kv_heads;
  c.head_dim = b.head_dim;
  c.tie_embeddings = b.tie_embeddings;
  return c;
}

ArchConfig diff_v1_of(const BaseSize& b) {
  need(b.n_heads % 2 == 0, "DIFF V1 pairs two heads of the standard model: n_heads must be even, got " +
                               std::to_string(b.n_heads));
  need(b.n_kv_heads % 2 == 0,
       "DIFF V1 keeps the key/value size with half as many groups of 2D-wide values: n_kv_heads "
       "must be even, got " + std::to_string(b.n_kv_heads));
  ArchConfig c = standard_of(b);
  c.attention = "diff_v1";
  c.n_heads = b.n_heads / 2;  // h = d_model / 2d (arXiv:2410.05258, Section 2.1)
  c.n_kv_heads = b.n_kv_heads / 2;
  return c;
}

ArchConfig diff_v2_of(const BaseSize& b) {
  ArchConfig c = standard_of(b);
  c.attention = "diff_v2";
  return c;
}

int64_t v2_matched_ffn(const BaseSize& b) {
  return v2_matched_ffn_dim(b.ffn_dim, b.d_model, b.n_heads, b.head_dim);
}

ModelConfig model_config_of(const ArchConfig& c) {
  check(c);
  ModelConfig m;
  m.attention = parse_attn_kind(c.attention, "model config: attention");
  m.vocab_size = c.vocab_size;
  m.d_model = c.d_model;
  m.n_layers = c.n_layers;
  m.ffn_dim = c.ffn_dim;
  m.n_heads = c.n_heads;
  m.n_kv_heads = c.n_kv_heads;
  m.head_dim = c.head_dim;
  m.tie_embeddings = c.tie_embeddings;
  m.max_seq_len = 1;  // no tensor depends on it
  return m;
}

// FORMAT.md's tensor list is tensor_table (src/model/config.cpp), the one the model loads and
// saves; accounting only adds each tensor's component.
std::vector<TensorSpec> format_tensors(const ArchConfig& c) {
  auto component = [](const std::string& n) -> std::string {
    auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
    if (has("embed_tokens")) return "embeddings";
    if (has("lm_head")) return "head";
    if (has("norm.weight") || has("subln")) return "norms";
    if (has("lambda")) return "lambda";
    if (has(".attn.")) return "attention";
    return "ffn";
  };
  std::vector<TensorSpec> t;
  for (const TensorInfo& i : tensor_table(model_config_of(c))) t.push_back({i.name, i.shape, component(i.name)});
  return t;
}

Accounting account(const ArchConfig& c, int64_t context, double bytes_per_value) {
  if (context < 1) throw InvalidArgument("accounting: context must be >= 1, got " + std::to_string(context));
  if (!(bytes_per_value > 0)) throw InvalidArgument("accounting: bytes per value must be > 0");
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
  const bool v1 = c.attention == "diff_v1", v2 = c.attention == "diff_v2";
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

}  // namespace diffattn

#include <sys/stat.h>

#include "diffattn/files.h"
#include "diffattn/model.h"

namespace diffattn {

// config.json has one parser, the model's (every FORMAT.md rule and error message); this
// keeps the fields the accounting needs.
ArchConfig parse_arch_config(const std::string& json_text, const std::string& source) {
  const ModelConfig m = ModelConfig::from_json(json_text, source);
  ArchConfig c;
  c.attention = nn::attn_kind_name(m.attention);
  c.vocab_size = m.vocab_size;
  c.d_model = m.d_model;
  c.n_layers = m.n_layers;
  c.ffn_dim = m.ffn_dim;
  c.n_heads = m.n_heads;
  c.n_kv_heads = m.n_kv_heads;
  c.head_dim = m.head_dim;
  c.tie_embeddings = m.tie_embeddings;  // from_json has validated every size
  return c;
}

ArchConfig read_arch_config(const std::string& path) {
  struct stat st {};
  const bool dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  const std::string file = dir ? path + "/config.json" : path;
  return parse_arch_config(read_file(file, kMaxJsonFileBytes), file);
}

BaseSize base_of(const ArchConfig& c) {
  BaseSize b;
  b.vocab_size = c.vocab_size;
  b.d_model = c.d_model;
  b.n_layers = c.n_layers;
  b.ffn_dim = c.ffn_dim;
  b.head_dim = c.head_dim;
  b.tie_embeddings = c.tie_embeddings;
  const bool v1 = c.attention == "diff_v1";
  b.n_heads = v1 ? 2 * c.n_heads : c.n_heads;
  b.n_kv_heads = v1 ? 2 * c.n_kv_heads : c.n_kv_heads;
  return b;
}

}  // namespace diffattn
