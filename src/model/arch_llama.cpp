// Llama (transformers' LlamaForCausalLM, model_type "llama"), read as the project's standard
// model, and the Llama-like layout DiffLlama and Motif-2 extend (src/model/arch.h): the shared
// config.json keys (sizes, heads, RoPE) and the writer of the halves / rotate-half layout.
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "diffattn/base/json_util.h"
#include "model/arch.h"
#include "model/config_json.h"

namespace diffattn::model {

using json = nlohmann::json;

ModelConfig translate_llama_like(const ConfigKeys& k, ArchLayout& L, int64_t default_positions) {
  const json& j = k.json();
  const std::string& where = k.where();
  if (!L.motif && k.has("hidden_act") && j.at("hidden_act") != "silu") {
    throw InvalidArgument(where + ": hidden_act " + json_brief(j.at("hidden_act")) +
                          " is not supported (the MLP is SwiGLU: \"silu\")");
  }
  if (k.number_or("partial_rotary_factor", 1.0) != 1.0) {
    throw InvalidArgument(where + ": partial_rotary_factor " +
                          json_brief(j.at("partial_rotary_factor")) +
                          " is not supported (RoPE rotates the whole head)");
  }
  if (k.has("pretraining_tp") && !(j.at("pretraining_tp").is_number_integer())) {
    throw InvalidArgument(where + ": \"pretraining_tp\" must be an integer");
  }
  const int64_t C = k.integer("hidden_size");
  L.H = k.integer("num_attention_heads");
  L.Hkv = k.has("num_key_value_heads") ? k.integer("num_key_value_heads") : L.H;
  if (k.has("head_dim")) {
    L.d = k.integer("head_dim");
  } else {
    if (C % L.H != 0) {
      throw InvalidArgument(where + ": hidden_size = " + std::to_string(C) +
                            " is not a multiple of num_attention_heads = " + std::to_string(L.H) +
                            " (and no head_dim is given)");
    }
    L.d = C / L.H;
  }
  if (!L.motif && L.H % L.Hkv != 0) {  // Motif-2: key/value pairs per group, checked below
    throw InvalidArgument(where + ": num_key_value_heads = " + std::to_string(L.Hkv) +
                          " does not divide num_attention_heads = " + std::to_string(L.H));
  }
  if (L.motif) {
    // G noise heads, each closing a group of S = H / G query heads; P = Hkv / 2 key/value pairs,
    // group g reading pair g / (G / P) (docs/models/motif2.md, "Attention", steps 3-5).
    L.G = k.has("num_noise_heads") ? k.integer("num_noise_heads") : L.H / 2;
    const int64_t P = L.Hkv / 2;
    if (L.G < 1 || L.H % L.G != 0 || L.H / L.G < 2 || L.Hkv % 2 != 0 || P < 1 || L.G % P != 0) {
      throw InvalidArgument(where + ": Motif's grouped heads need num_noise_heads (G = " +
                            std::to_string(L.G) + ") to divide num_attention_heads (" +
                            std::to_string(L.H) + ") at least twice, an even num_key_value_heads (" +
                            std::to_string(L.Hkv) + ") and its pairs to divide G");
    }
    L.S = L.H / L.G;
  } else if (L.diff && (L.H % 2 != 0 || L.Hkv % 2 != 0)) {
    throw InvalidArgument(where + ": DiffLlama splits the heads in two halves, so " +
                          std::string(L.H % 2 ? "num_attention_heads = " + std::to_string(L.H)
                                              : "num_key_value_heads = " + std::to_string(L.Hkv)) +
                          " must be even");
  }

  ModelConfig c;
  c.attention = L.diff ? nn::AttnKind::DiffV1 : nn::AttnKind::Standard;
  c.vocab_size = k.integer("vocab_size");
  c.d_model = C;
  c.n_layers = k.integer("num_hidden_layers");
  c.ffn_dim = k.integer("intermediate_size");
  c.n_heads = L.motif ? L.H - L.G : L.diff ? L.H / 2 : L.H;
  c.n_kv_heads = L.diff ? L.Hkv / 2 : L.Hkv;
  c.head_dim = L.d;
  c.max_seq_len = k.integer_or("max_position_embeddings", default_positions);
  c.norm_eps = static_cast<float>(k.number_or("rms_norm_eps", 1e-6));
  c.tie_embeddings = k.boolean_or("tie_word_embeddings", false);
  c.attn_bias = k.boolean_or("attention_bias", false);
  c.mlp_bias = k.boolean_or("mlp_bias", false);
  // RoPE: transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; 4.x writes
  // rope_theta and rope_scaling (null when unscaled).
  c.rope_theta = k.number_or("rope_theta", 10000.0);
  if (k.has("rope_parameters")) {
    const json& r = j.at("rope_parameters");
    if (!r.is_object()) {
      throw InvalidArgument(where + ": rope_parameters must be an object, got " + json_brief(r));
    }
    if (r.contains("rope_theta")) {
      if (!r.at("rope_theta").is_number()) {
        throw InvalidArgument(where + ": rope_parameters: \"rope_theta\" must be a number");
      }
      c.rope_theta = r.at("rope_theta").get<double>();
    }
    c.rope_scaling = parse_rope_scaling(r, where + ": rope_parameters");
  } else if (k.has("rope_scaling")) {
    c.rope_scaling = parse_rope_scaling(j.at("rope_scaling"), where + ": rope_scaling");
  }
  return c;
}

std::string save_llama_like(const Model& m, const std::string& dir, DType dtype, int64_t shards,
                            const ModelFiles& files, bool diff) {
  const ModelConfig& c = m.config();
  if (c.lambda_init_shift != 0 || c.noise_share != 1 ||
      (c.subln_eps && *c.subln_eps != c.norm_eps)) {
    throw InvalidArgument("the model has Motif-2 attention settings (lambda_init_shift, "
                          "noise_share or subln_eps) but a SwiGLU MLP; neither DiffLlama nor Motif-2 "
                          "computes that");
  }
  if (c.attention == nn::AttnKind::DiffV2) {
    throw InvalidArgument("transformers has no DIFF V2 model; only diff_v1 (DiffLlama) and "
                          "standard (Llama) models can be written as Hugging Face directories");
  }
  if (diff && c.lambda_init) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const double sched = 0.8 - 0.6 * std::exp(-0.3 * static_cast<double>(l));
      if (static_cast<float>(*c.lambda_init) != static_cast<float>(sched)) {
        throw InvalidArgument("the model has a fixed lambda_init = " +
                              std::to_string(*c.lambda_init) +
                              "; DiffLlama always uses 0.8 - 0.6 exp(-0.3 l), so its logits would differ");
      }
    }
  }
  ArchLayout L;
  L.diff = diff;
  L.H = diff ? 2 * c.n_heads : c.n_heads;
  L.Hkv = diff ? 2 * c.n_kv_heads : c.n_kv_heads;
  L.d = c.head_dim;
  const Permutation perm{L};
  const int64_t C = c.d_model;

  // Every tensor as float32 under its transformers name, permuted back to halves / rotate-half.
  HfTensors out;
  auto put = [&](const std::string& name, Shape shape, std::vector<float> data) {
    out.push_back({name, {std::move(shape), std::move(data)}});
  };
  auto rows_back = [&](const std::vector<float>& ours, int64_t rows, int64_t cols, auto src_of) {
    std::vector<float> hf(ours.size());
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&hf[static_cast<size_t>(src_of(r) * cols)], &ours[static_cast<size_t>(r * cols)],
                  sizeof(float) * static_cast<size_t>(cols));
    }
    return hf;
  };
  put("model.embed_tokens.weight", {c.vocab_size, C}, m.weight_f32("embed_tokens.weight"));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    const nn::AttnLayerShape s = c.attn_shape(l);
    put(hf + "input_layernorm.weight", {C}, m.weight_f32(p + "attn_norm.weight"));
    const int64_t nq = L.H * L.d, nk = L.Hkv * L.d;
    auto q = [&](int64_t r) { return perm.q_src(r); };
    auto k = [&](int64_t r) { return perm.k_src(r); };
    auto v = [&](int64_t r) { return perm.v_src(r); };
    put(hf + "self_attn.q_proj.weight", {nq, C}, rows_back(m.weight_f32(p + "attn.q_proj.weight"), nq, C, q));
    put(hf + "self_attn.k_proj.weight", {nk, C}, rows_back(m.weight_f32(p + "attn.k_proj.weight"), nk, C, k));
    put(hf + "self_attn.v_proj.weight", {nk, C}, rows_back(m.weight_f32(p + "attn.v_proj.weight"), nk, C, v));
    if (c.attn_bias) {
      put(hf + "self_attn.q_proj.bias", {nq}, rows_back(m.weight_f32(p + "attn.q_proj.bias"), nq, 1, q));
      put(hf + "self_attn.k_proj.bias", {nk}, rows_back(m.weight_f32(p + "attn.k_proj.bias"), nk, 1, k));
      put(hf + "self_attn.v_proj.bias", {nk}, rows_back(m.weight_f32(p + "attn.v_proj.bias"), nk, 1, v));
      put(hf + "self_attn.o_proj.bias", {C}, m.weight_f32(p + "attn.out_proj.bias"));
    }
    std::vector<float> o = m.weight_f32(p + "attn.out_proj.weight");  // (C, H*Dv)
    if (diff) {
      // (1 - lambda_init) * rmsnorm(o_h) * w feeds o_proj: w moves into o_proj's columns.
      const std::vector<float> w = m.weight_f32(p + "attn.subln.weight");  // (2D)
      const int64_t no = s.n_out(), Dv = s.Dv();
      for (int64_t r = 0; r < C; ++r) {
        for (int64_t col = 0; col < no; ++col) {
          float& x = o[static_cast<size_t>(r * no + col)];
          x = static_cast<float>(static_cast<double>(x) * w[static_cast<size_t>(col % Dv)]);
        }
      }
      for (const char* n : {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"}) {
        put(hf + "self_attn." + n, {L.d}, m.weight_f32(p + "attn." + n));
      }
    }
    put(hf + "self_attn.o_proj.weight", {C, s.n_out()}, std::move(o));
    put(hf + "post_attention_layernorm.weight", {C}, m.weight_f32(p + "ffn_norm.weight"));
    put(hf + "mlp.gate_proj.weight", {c.ffn_dim, C}, m.weight_f32(p + "ffn.gate_proj.weight"));
    put(hf + "mlp.up_proj.weight", {c.ffn_dim, C}, m.weight_f32(p + "ffn.up_proj.weight"));
    put(hf + "mlp.down_proj.weight", {C, c.ffn_dim}, m.weight_f32(p + "ffn.down_proj.weight"));
    if (c.mlp_bias) {
      put(hf + "mlp.gate_proj.bias", {c.ffn_dim}, m.weight_f32(p + "ffn.gate_proj.bias"));
      put(hf + "mlp.up_proj.bias", {c.ffn_dim}, m.weight_f32(p + "ffn.up_proj.bias"));
      put(hf + "mlp.down_proj.bias", {C}, m.weight_f32(p + "ffn.down_proj.bias"));
    }
  }
  put("model.norm.weight", {C}, m.weight_f32("norm.weight"));
  if (!c.tie_embeddings) put("lm_head.weight", {c.vocab_size, C}, m.weight_f32("lm_head.weight"));

  // config.json in transformers 4.x's spelling (rope_theta + rope_scaling), read by 5.x too.
  json j;
  j["architectures"] = {diff ? "DiffLlamaForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = diff ? "diffllama" : "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = C;
  j["intermediate_size"] = c.ffn_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = L.H;
  j["num_key_value_heads"] = L.Hkv;
  j["head_dim"] = L.d;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type == nn::RopeScaling::Type::None) {
    j["rope_scaling"] = nullptr;
  } else {
    json r = {{"rope_type", nn::rope_type_name(c.rope_scaling.type)}, {"factor", c.rope_scaling.factor}};
    if (c.rope_scaling.type == nn::RopeScaling::Type::Llama3) {
      r["low_freq_factor"] = c.rope_scaling.low_freq_factor;
      r["high_freq_factor"] = c.rope_scaling.high_freq_factor;
      r["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = r;
  }
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["attention_bias"] = c.attn_bias;
  j["attention_dropout"] = 0.0;
  if (diff) {
    j["lambda_std_dev"] = 0.1;
  } else {
    j["mlp_bias"] = c.mlp_bias;
    j["pretraining_tp"] = 1;
  }
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype_name(dtype);

  return write_hf_dir(out, j, dir, dtype, shards, files);
}

namespace {

ModelConfig translate(const ConfigKeys& k, ArchLayout& L) {
  ModelConfig c = translate_llama_like(k, L, 2048);
  c.validate(k.where());
  return c;
}

}  // namespace

const ArchFamily kLlamaFamily = {
    "llama",
    [](const std::string& t) { return t == "llama"; },
    translate,
    load_llama_like,
    // Standard attention (and DIFF V2, refused by the writer with the reason) in a SwiGLU model.
    [](const ModelConfig& c) { return c.mlp != MlpKind::PolyNorm && c.attention != nn::AttnKind::DiffV1; },
    [](const Model& m, const std::string& dir, DType dtype, int64_t shards, const ModelFiles& files) {
      return save_llama_like(m, dir, dtype, shards, files, false);
    },
};

}  // namespace diffattn::model
