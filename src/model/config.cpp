// config.json of docs/FORMAT.md: parsing with every key checked (unknown keys are errors), the
// derived per-layer attention shapes, the presets, and the table of tensors a config implies.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <nlohmann/json.hpp>
#include <set>

#include "diffattn/base/json_util.h"
#include "diffattn/model/config.h"
#include "model/config_json.h"

namespace diffattn::model {

using json = nlohmann::json;

nn::AttnKind parse_attn_kind(const std::string& name, const std::string& where) {
  if (name == "diff_v1") return nn::AttnKind::DiffV1;
  if (name == "diff_v2") return nn::AttnKind::DiffV2;
  if (name == "standard") return nn::AttnKind::Standard;
  throw InvalidArgument(where + ": attention is \"" + printable(name.substr(0, 40)) +
                        "\", expected \"diff_v1\", \"diff_v2\" or \"standard\"");
}

nn::RopeScaling parse_rope_scaling(const json& r, const std::string& where) {
  if (!r.is_object()) throw InvalidArgument(where + " must be an object, got " + json_brief(r));
  nn::RopeScaling s;
  // transformers writes "rope_type" (older versions "type")
  const char* type_key = r.contains("rope_type") ? "rope_type" : "type";
  if (!r.contains(type_key) || !r.at(type_key).is_string()) {
    throw InvalidArgument(where + ": missing \"rope_type\" (a string)");
  }
  const std::string type = r.at(type_key).get<std::string>();
  auto number = [&](const char* key) {
    if (!r.contains(key)) throw InvalidArgument(where + ": missing \"" + std::string(key) + "\"");
    const json& v = r.at(key);
    if (!v.is_number()) {
      throw InvalidArgument(where + ": \"" + key + "\" must be a number, got " + json_brief(v));
    }
    return v.get<double>();
  };
  if (type == "default") return s;
  if (type == "linear") {
    s.type = nn::RopeScaling::Type::Linear;
    s.factor = number("factor");
  } else if (type == "llama3") {
    s.type = nn::RopeScaling::Type::Llama3;
    s.factor = number("factor");
    s.low_freq_factor = number("low_freq_factor");
    s.high_freq_factor = number("high_freq_factor");
    const json& o = r.contains("original_max_position_embeddings") ? r.at("original_max_position_embeddings") : json();
    if (!o.is_number_integer()) {
      throw InvalidArgument(where + ": \"original_max_position_embeddings\" must be an integer, got " + json_brief(o));
    }
    s.original_max_position_embeddings = o.get<int64_t>();
  } else {
    throw InvalidArgument(where + ": rope type " + json_brief(r.at(type_key)) +
                          " is not supported (diffattn reads \"default\", \"linear\" and \"llama3\")");
  }
  return s;
}

const char* mlp_kind_name(MlpKind k) { return k == MlpKind::PolyNorm ? "polynorm" : "swiglu"; }

float ModelConfig::layer_lambda_init(int64_t l) const {
  if (lambda_init) return static_cast<float>(*lambda_init);
  return static_cast<float>(0.8 - 0.6 * std::exp(-0.3 * static_cast<double>(l - lambda_init_shift)));
}

nn::AttnLayerShape ModelConfig::attn_shape(int64_t l) const {
  nn::AttnLayerShape s;
  s.kind = attention;
  s.C = d_model;
  s.H = n_heads;
  s.G = n_kv_heads;
  s.D = head_dim;
  s.eps = subln_eps ? *subln_eps : norm_eps;
  s.lambda_init = attention == nn::AttnKind::DiffV1 ? layer_lambda_init(l) : 0.0f;
  s.noise_share = attention == nn::AttnKind::DiffV1 ? noise_share : 1;
  return s;
}

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::Attention: return "attention";
    case LayerKind::Mamba: return "mamba";
    case LayerKind::SlidingAttention: return "sliding_attention";
    case LayerKind::FullAttention: return "full_attention";
    case LayerKind::Gmu: return "gmu";
    case LayerKind::CrossAttention: return "cross_attention";
  }
  return "?";
}

LayerKind ModelConfig::layer_kind(int64_t l) const {
  if (arch == Arch::Decoder) return LayerKind::Attention;
  const int64_t h = n_layers / 2;
  if (l % 2 == 0) return l <= h ? LayerKind::Mamba : LayerKind::Gmu;
  if (l < h) return LayerKind::SlidingAttention;
  return l == h + 1 ? LayerKind::FullAttention : LayerKind::CrossAttention;
}

void ModelConfig::validate(const std::string& where) const {
  // Each size between 1 and a bound far above any published model (Llama 3 405B: vocab 128256,
  // d_model 16384, 126 layers, ffn 53248): a wrapped or absurd size is an error here, before
  // tensor_table multiplies them or anything is allocated.
  auto in_range = [&](const char* key, int64_t v, int64_t hi) {
    if (v < 1 || v > hi) {
      throw InvalidArgument(where + ": " + key + " must be between 1 and " + std::to_string(hi) +
                            ", got " + std::to_string(v));
    }
  };
  in_range("vocab_size", vocab_size, int64_t{1} << 24);
  in_range("d_model", d_model, int64_t{1} << 18);
  in_range("n_layers", n_layers, int64_t{1} << 12);
  in_range("n_heads", n_heads, int64_t{1} << 12);
  in_range("n_kv_heads", n_kv_heads, int64_t{1} << 12);
  in_range("head_dim", head_dim, int64_t{1} << 14);
  in_range("ffn_dim", ffn_dim, int64_t{1} << 20);
  in_range("max_seq_len", max_seq_len, int64_t{1} << 24);
  if (n_heads % n_kv_heads != 0) {
    throw InvalidArgument(where + ": n_kv_heads = " + std::to_string(n_kv_heads) +
                          " does not divide n_heads = " + std::to_string(n_heads));
  }
  if (head_dim % 2 != 0) {
    throw InvalidArgument(where + ": head_dim = " + std::to_string(head_dim) +
                          " must be even (RoPE rotates pairs)");
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    throw InvalidArgument(where + ": rope_theta must be a positive number");
  }
  if (!(norm_eps > 0) || !std::isfinite(norm_eps)) {
    throw InvalidArgument(where + ": norm_eps must be a positive number");
  }
  if (lambda_init && !std::isfinite(*lambda_init)) {
    throw InvalidArgument(where + ": lambda_init must be a finite number");
  }
  if (attn_bias && attention == nn::AttnKind::DiffV2) {
    throw InvalidArgument(where + ": attention_bias is supported for diff_v1 and standard, not diff_v2");
  }
  const nn::RopeScaling& rs = rope_scaling;
  if (rs.type != nn::RopeScaling::Type::None) {
    if (!(rs.factor >= 1.0) || !std::isfinite(rs.factor)) {
      throw InvalidArgument(where + ": rope_scaling factor must be a number >= 1");
    }
    if (rs.type == nn::RopeScaling::Type::Llama3 &&
        (!(rs.low_freq_factor > 0) || !(rs.high_freq_factor > rs.low_freq_factor) ||
         !std::isfinite(rs.high_freq_factor) || rs.original_max_position_embeddings < 1 ||
         rs.original_max_position_embeddings > (int64_t{1} << 24))) {
      throw InvalidArgument(where + ": llama3 rope_scaling needs 0 < low_freq_factor < "
                            "high_freq_factor and original_max_position_embeddings in [1, 2^24]");
    }
  }
  if (lambda_init_shift < 0 || lambda_init_shift > 1) {
    throw InvalidArgument(where + ": lambda_init_shift must be 0 or 1, got " +
                          std::to_string(lambda_init_shift));
  }
  if (subln_eps && (!(*subln_eps > 0) || !std::isfinite(*subln_eps))) {
    throw InvalidArgument(where + ": subln_eps must be a positive number");
  }
  if (noise_share != 1) {
    if (attention != nn::AttnKind::DiffV1) {
      throw InvalidArgument(where + ": noise_share applies to diff_v1 only");
    }
    // the pairs sharing a noise head read one key/value group
    if (noise_share < 1 || (n_heads / n_kv_heads) % noise_share != 0) {
      throw InvalidArgument(where + ": noise_share = " + std::to_string(noise_share) +
                            " must be >= 1 and divide the pairs per key/value group (" +
                            std::to_string(n_heads / n_kv_heads) + ")");
    }
  }
  if (lambda_init && attention != nn::AttnKind::DiffV1) {
    throw InvalidArgument(where + ": lambda_init applies to diff_v1 only, attention is \"" +
                          nn::attn_kind_name(attention) + "\"");
  }
  if (arch == Arch::SambaY) {
    // The published code's layer pattern needs L % 4 == 0 (docs/models/phi4flash.md).
    if (n_layers % 4 != 0) {
      throw InvalidArgument(where + ": num_hidden_layers = " + std::to_string(n_layers) +
                            " must be a multiple of 4 (the SambaY layer pattern)");
    }
    if (attention != nn::AttnKind::DiffV1 || !attn_bias || mlp != MlpKind::SwiGLU || mlp_bias ||
        !tie_embeddings || noise_share != 1) {
      throw InvalidArgument(where + ": a SambaY model has diff_v1 attention with biases, a "
                            "SwiGLU MLP without biases and tied embeddings");
    }
    in_range("mamba_d_state", sambay.d_state, 256);
    in_range("mamba_d_conv", sambay.d_conv, 16);
    in_range("mamba_expand", sambay.expand, 16);
    in_range("mamba dt rank", sambay.dt_rank, int64_t{1} << 16);
    in_range("sliding_window", sambay.window, int64_t{1} << 24);
  }
}

std::string ModelConfig::to_json() const {
  json j;
  j["format"] = "diffattn/1";
  j["attention"] = nn::attn_kind_name(attention);
  j["vocab_size"] = vocab_size;
  j["d_model"] = d_model;
  j["n_layers"] = n_layers;
  j["n_heads"] = n_heads;
  j["n_kv_heads"] = n_kv_heads;
  j["head_dim"] = head_dim;
  j["ffn_dim"] = ffn_dim;
  j["max_seq_len"] = max_seq_len;
  j["rope_theta"] = rope_theta;
  // norm_eps is kept as a float; written as the shortest decimal that reads back as that
  // float (1e-05, not its double widening 9.999999747378752e-06)
  char eps[32];
  const auto r = std::to_chars(eps, eps + sizeof eps, norm_eps);
  j["norm_eps"] = std::strtod(std::string(eps, r.ptr).c_str(), nullptr);
  j["tie_embeddings"] = tie_embeddings;
  if (lambda_init) j["lambda_init"] = *lambda_init;
  if (rope_scaling.type != nn::RopeScaling::Type::None) {
    json r = {{"rope_type", nn::rope_type_name(rope_scaling.type)}, {"factor", rope_scaling.factor}};
    if (rope_scaling.type == nn::RopeScaling::Type::Llama3) {
      r["low_freq_factor"] = rope_scaling.low_freq_factor;
      r["high_freq_factor"] = rope_scaling.high_freq_factor;
      r["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = r;
  }
  if (attn_bias) j["attention_bias"] = true;
  if (mlp_bias) j["mlp_bias"] = true;
  if (mlp != MlpKind::SwiGLU) j["mlp"] = mlp_kind_name(mlp);
  if (lambda_init_shift != 0) j["lambda_init_shift"] = lambda_init_shift;
  if (subln_eps) {
    char e[32];
    const auto r2 = std::to_chars(e, e + sizeof e, *subln_eps);
    j["subln_eps"] = std::strtod(std::string(e, r2.ptr).c_str(), nullptr);
  }
  if (noise_share != 1) j["noise_share"] = noise_share;
  if (arch == Arch::SambaY) {
    // What the model runs, for looking at (a SambaY model is read from its Hugging Face
    // directory; this format does not hold it).
    j["arch"] = "sambay";
    j["mamba_d_state"] = sambay.d_state;
    j["mamba_d_conv"] = sambay.d_conv;
    j["mamba_expand"] = sambay.expand;
    j["mamba_dt_rank"] = sambay.dt_rank;
    j["sliding_window"] = sambay.window;
    json kinds = json::array();
    for (int64_t l = 0; l < n_layers; ++l) kinds.push_back(layer_kind_name(layer_kind(l)));
    j["layer_kinds"] = kinds;
  }
  return j.dump(2) + "\n";
}

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& where) {
  return config_from_json(parse_json_object(text, where), where);
}

ModelConfig config_from_json(const json& j, const std::string& where) {
  static const std::set<std::string> known = {
      "format",  "attention", "vocab_size", "d_model",    "n_layers",       "n_heads",
      "n_kv_heads", "head_dim", "ffn_dim",  "max_seq_len", "rope_theta",    "norm_eps",
      "tie_embeddings", "lambda_init", "rope_scaling", "attention_bias", "mlp_bias",
      "mlp", "lambda_init_shift", "subln_eps", "noise_share"};
  for (const auto& [key, value] : j.items()) {
    if (!known.count(key)) throw InvalidArgument(where + ": unknown key \"" + printable(key.substr(0, 80)) + "\"");
  }
  auto need = [&](const char* key) -> const json& {
    if (!j.contains(key)) throw InvalidArgument(where + ": missing key \"" + key + "\"");
    return j.at(key);
  };
  auto integer = [&](const char* key) {
    const json& v = need(key);
    if (!v.is_number_integer()) {
      throw InvalidArgument(where + ": \"" + key + "\" must be an integer, got " + json_brief(v));
    }
    return v.get<int64_t>();
  };
  auto number = [&](const char* key) {
    const json& v = need(key);
    if (!v.is_number()) {
      throw InvalidArgument(where + ": \"" + key + "\" must be a number, got " + json_brief(v));
    }
    return v.get<double>();
  };
  const json& fmt = need("format");
  if (!fmt.is_string() || fmt.get<std::string>() != "diffattn/1") {
    throw InvalidArgument(where + ": \"format\" is " + json_brief(fmt) + ", expected \"diffattn/1\"");
  }
  const json& att = need("attention");
  if (!att.is_string()) throw InvalidArgument(where + ": \"attention\" must be a string");
  ModelConfig c;
  c.attention = parse_attn_kind(att.get<std::string>(), where);
  c.vocab_size = integer("vocab_size");
  c.d_model = integer("d_model");
  c.n_layers = integer("n_layers");
  c.n_heads = integer("n_heads");
  c.n_kv_heads = integer("n_kv_heads");
  c.head_dim = integer("head_dim");
  c.ffn_dim = integer("ffn_dim");
  c.max_seq_len = integer("max_seq_len");
  c.rope_theta = number("rope_theta");
  c.norm_eps = static_cast<float>(number("norm_eps"));
  const json& tie = need("tie_embeddings");
  if (!tie.is_boolean()) throw InvalidArgument(where + ": \"tie_embeddings\" must be true or false");
  c.tie_embeddings = tie.get<bool>();
  if (j.contains("lambda_init") && !j.at("lambda_init").is_null()) {
    c.lambda_init = number("lambda_init");
  }
  if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) {
    c.rope_scaling = parse_rope_scaling(j.at("rope_scaling"), where + ": rope_scaling");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (!j.contains(key)) continue;
    if (!j.at(key).is_boolean()) throw InvalidArgument(where + ": \"" + key + "\" must be true or false");
    (std::string(key) == "mlp_bias" ? c.mlp_bias : c.attn_bias) = j.at(key).get<bool>();
  }
  if (j.contains("mlp")) {
    const json& v = j.at("mlp");
    if (v == "swiglu") {
      c.mlp = MlpKind::SwiGLU;
    } else if (v == "polynorm") {
      c.mlp = MlpKind::PolyNorm;
    } else {
      throw InvalidArgument(where + ": \"mlp\" is " + json_brief(v) + ", expected \"swiglu\" or \"polynorm\"");
    }
  }
  if (j.contains("lambda_init_shift")) c.lambda_init_shift = integer("lambda_init_shift");
  if (j.contains("subln_eps")) c.subln_eps = static_cast<float>(number("subln_eps"));
  if (j.contains("noise_share")) c.noise_share = integer("noise_share");
  c.validate(where);
  return c;
}

ModelConfig model_of_size(nn::AttnKind kind, int64_t d_model, int64_t n_layers, int64_t n_std,
                          int64_t ffn, int64_t max_seq_len, int64_t vocab_size) {
  // The standard model: n_std heads of size D = d_model / n_std; DIFF V1: n_std / 2 pairs of
  // two D-sized sub-heads with 2D-sized values (arXiv:2410.05258 section 2.1, h = d_model / 2d).
  if (n_std < 1 || d_model % n_std != 0 || (kind == nn::AttnKind::DiffV1 && n_std % 2 != 0)) {
    throw InvalidArgument("model size: " + std::to_string(n_std) + " heads must divide d_model = " +
                          std::to_string(d_model) + (kind == nn::AttnKind::DiffV1 ? " and be even (DIFF V1 pairs them)" : ""));
  }
  ModelConfig c;
  c.attention = kind;
  c.vocab_size = vocab_size;
  c.d_model = d_model;
  c.n_layers = n_layers;
  c.max_seq_len = max_seq_len;
  c.head_dim = d_model / n_std;
  c.ffn_dim = ffn;
  c.n_heads = kind == nn::AttnKind::DiffV1 ? n_std / 2 : n_std;
  c.n_kv_heads = c.n_heads;
  if (kind == nn::AttnKind::DiffV2) {
    c.ffn_dim = v2_matched_ffn_dim(ffn, c.d_model, c.n_heads, c.head_dim);
  }
  c.validate("model size");
  return c;
}

int64_t v2_matched_ffn_dim(int64_t ffn, int64_t d_model, int64_t n_heads, int64_t head_dim) {
  const int64_t extra = n_heads * head_dim * d_model + n_heads * d_model;
  const int64_t per_row = 3 * d_model;
  return ffn - (extra + per_row / 2) / per_row;
}

ModelConfig model_preset(const std::string& name, nn::AttnKind kind, int64_t vocab_size) {
  if (name == "tiny") return model_of_size(kind, 64, 2, 4, 176, 128, vocab_size);
  if (name == "small") return model_of_size(kind, 256, 6, 8, 688, 256, vocab_size);
  throw InvalidArgument("preset is \"" + name + "\", expected \"tiny\" or \"small\"");
}

namespace {

// Phi-4-mini-flash's tensors (docs/models/phi4flash.md, "Tensors") under their published names
// less "model.", in the published shapes.
void sambay_table(const ModelConfig& c, const std::function<void(const std::string&, Shape)>& add) {
  const int64_t C = c.d_model, E = c.mamba_inner(), N = c.sambay.d_state, K = c.sambay.d_conv;
  const int64_t R = c.sambay.dt_rank;
  add("embed_tokens.weight", {c.vocab_size, C});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {C});
    add(p + "input_layernorm.bias", {C});
    const LayerKind k = c.layer_kind(l);
    const std::string a = p + "attn.";
    if (k == LayerKind::Mamba) {
      add(a + "in_proj.weight", {2 * E, C});
      add(a + "conv1d.weight", {E, 1, K});
      add(a + "conv1d.bias", {E});
      add(a + "x_proj.weight", {R + 2 * N, E});
      add(a + "dt_proj.weight", {E, R});
      add(a + "dt_proj.bias", {E});
      add(a + "A_log", {E, N});
      add(a + "D", {E});
      add(a + "out_proj.weight", {C, E});
    } else if (k == LayerKind::Gmu) {
      add(a + "in_proj.weight", {E, C});
      add(a + "out_proj.weight", {C, E});
    } else {
      const nn::AttnLayerShape s = c.attn_shape(l);
      const int64_t rows = k == LayerKind::CrossAttention ? s.n_q() : s.n_q() + s.n_k() + s.n_v();
      add(a + "Wqkv.weight", {rows, C});
      add(a + "Wqkv.bias", {rows});
      add(a + "out_proj.weight", {C, s.n_out()});
      add(a + "out_proj.bias", {C});
      for (const char* v : {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"}) {
        add(a + "inner_cross_attn." + v, {s.D});
      }
      add(a + "inner_cross_attn.subln.weight", {2 * s.D});
    }
    add(p + "post_attention_layernorm.weight", {C});
    add(p + "post_attention_layernorm.bias", {C});
    add(p + "mlp.fc1.weight", {2 * c.ffn_dim, C});
    add(p + "mlp.fc2.weight", {C, c.ffn_dim});
  }
  add("final_layernorm.weight", {C});
  add("final_layernorm.bias", {C});
}

}  // namespace

std::vector<TensorInfo> tensor_table(const ModelConfig& c) {
  std::vector<TensorInfo> t;
  int64_t off = 0;
  // Sizes come from a config.json: every product and the running offset are checked.
  auto add = [&](const std::string& name, Shape shape, bool decay) {
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
        throw InvalidArgument("tensor " + name + " of shape " + shape_str(shape) +
                              ": size out of range");
      }
    }
    t.push_back({name, shape, off, n, decay});
    if (__builtin_add_overflow(off, n, &off)) {
      throw InvalidArgument("tensor " + name + ": the model's total size overflows 64 bits");
    }
  };
  const int64_t C = c.d_model;
  if (c.arch == Arch::SambaY) {
    sambay_table(c, [&](const std::string& name, Shape shape) { add(name, shape, false); });
    return t;
  }
  add("embed_tokens.weight", {c.vocab_size, C}, true);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const nn::AttnLayerShape s = c.attn_shape(l);
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {C}, false);
    add(p + "attn.q_proj.weight", {s.n_q(), C}, true);
    add(p + "attn.k_proj.weight", {s.n_k(), C}, true);
    add(p + "attn.v_proj.weight", {s.n_v(), C}, true);
    if (c.attention == nn::AttnKind::DiffV2) add(p + "attn.lambda_proj.weight", {s.H, C}, true);
    if (c.attn_bias) {
      add(p + "attn.q_proj.bias", {s.n_q()}, false);
      add(p + "attn.k_proj.bias", {s.n_k()}, false);
      add(p + "attn.v_proj.bias", {s.n_v()}, false);
    }
    add(p + "attn.out_proj.weight", {C, s.n_out()}, true);
    if (c.attn_bias) add(p + "attn.out_proj.bias", {C}, false);
    if (c.attention == nn::AttnKind::DiffV1) {
      add(p + "attn.lambda_q1", {s.D}, false);
      add(p + "attn.lambda_k1", {s.D}, false);
      add(p + "attn.lambda_q2", {s.D}, false);
      add(p + "attn.lambda_k2", {s.D}, false);
      add(p + "attn.subln.weight", {2 * s.D}, false);
    }
    add(p + "ffn_norm.weight", {C}, false);
    add(p + "ffn.gate_proj.weight", {c.ffn_dim, C}, true);
    add(p + "ffn.up_proj.weight", {c.ffn_dim, C}, true);
    add(p + "ffn.down_proj.weight", {C, c.ffn_dim}, true);
    if (c.mlp == MlpKind::PolyNorm) {
      add(p + "ffn.act_fn.weight", {3}, false);
      add(p + "ffn.act_fn.bias", {1}, false);
    }
    if (c.mlp_bias) {
      add(p + "ffn.gate_proj.bias", {c.ffn_dim}, false);
      add(p + "ffn.up_proj.bias", {c.ffn_dim}, false);
      add(p + "ffn.down_proj.bias", {C}, false);
    }
  }
  add("norm.weight", {C}, false);
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab_size, C}, true);
  return t;
}

int64_t count_params(const ModelConfig& cfg) {
  int64_t n = 0;
  for (const TensorInfo& t : tensor_table(cfg)) n += t.numel;
  return n;
}

}  // namespace diffattn::model
