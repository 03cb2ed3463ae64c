// Motif-2 (MotifForCausalLM, model_type "Motif"; docs/models/motif2.md), read as the project's
// diff_v1 model with a PolyNorm MLP: the Llama-like layout (arch_llama.cpp) with G noise heads,
// each closing a group of S query heads (S - 1 signal heads then the noise head), key/value
// heads in adjacent pairs (2j signal, 2j + 1 noise); signal head i becomes the project's pair i
// with its group's noise head as second sub-head (a copy per pair when S > 2: config
// noise_share = S - 1); a learned per-head RMSNorm (subln) and PolyNorm's act_fn weights.
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "diffattn/base/json_util.h"
#include "model/arch.h"

namespace diffattn::model {

using json = nlohmann::json;

namespace {

ModelConfig translate(const ConfigKeys& k, ArchLayout& L) {
  const json& j = k.json();
  const std::string& where = k.where();
  if (k.has("hidden_act") && j.at("hidden_act") != "poly_norm") {
    throw InvalidArgument(where + ": hidden_act " + json_brief(j.at("hidden_act")) +
                          " is not supported (Motif-2's MLP is PolyNorm: \"poly_norm\")");
  }
  for (const char* key : {"use_bias", "attention_bias", "qkv_bias", "mlp_bias"}) {
    if (k.boolean_or(key, false)) {
      throw InvalidArgument(where + ": " + key + " is true, but no Motif-2 model has biases "
                            "(diffattn reads Motif without them)");
    }
  }
  if (k.has("rope_scaling")) {
    throw InvalidArgument(where + ": rope_scaling " + json_brief(j.at("rope_scaling")) +
                          " is not supported for Motif (no published Motif-2 config sets one)");
  }
  if (k.has("k_ratio") && !(j.at("k_ratio").is_number_integer() && j.at("k_ratio").get<int64_t>() == 1)) {
    throw InvalidArgument(where + ": k_ratio " + json_brief(j.at("k_ratio")) +
                          " is not supported (Motif-2 pairs key heads: k_ratio 1)");
  }
  if (k.number_or("logit_scale", 1.0) != 1.0) {
    throw InvalidArgument(where + ": logit_scale " + json_brief(j.at("logit_scale")) +
                          " is not supported (Motif-2 does not scale its logits)");
  }
  L.diff = L.motif = true;
  ModelConfig c = translate_llama_like(k, L, 8192);
  c.mlp = MlpKind::PolyNorm;
  c.lambda_init_shift = 1;
  c.subln_eps = static_cast<float>(k.number_or("attn_rms_norm_eps", 1e-5));
  c.noise_share = L.S - 1;
  c.validate(where);
  return c;
}

// Motif-2's published layout (docs/models/motif2.md, "Tensors"): the inverse of the loader's
// permutation, one copy of each noise head.
std::string save(const Model& m, const std::string& dir, DType dtype, int64_t shards,
                 const ModelFiles& files) {
  HfTensors out;
  json j;
  const ModelConfig& c = m.config();
  if (c.attention != nn::AttnKind::DiffV1 || c.lambda_init || c.lambda_init_shift != 1 ||
      c.attn_bias || c.mlp_bias || c.rope_scaling.type != nn::RopeScaling::Type::None) {
    throw InvalidArgument("a PolyNorm model is written as Motif-2 (MotifForCausalLM), which "
                          "needs diff_v1 attention with lambda_init_shift 1, no fixed lambda_init, no "
                          "biases and no rope_scaling");
  }
  ArchLayout L;
  L.diff = L.motif = true;
  L.S = c.noise_share + 1;
  L.G = c.n_heads / c.noise_share;
  L.H = c.n_heads + L.G;
  L.Hkv = 2 * c.n_kv_heads;
  L.d = c.head_dim;
  const Permutation perm{L};
  const int64_t C = c.d_model, d = L.d;
  auto put = [&](const std::string& name, Shape shape, std::vector<float> data) {
    out.push_back({name, {std::move(shape), std::move(data)}});
  };
  put("model.embed_tokens.weight", {c.vocab_size, C}, m.weight_f32("embed_tokens.weight"));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    const nn::AttnLayerShape s = c.attn_shape(l);
    put(hf + "input_layernorm.weight", {C}, m.weight_f32(p + "attn_norm.weight"));
    // q: every project row r lands at perm.q_src(r); the copies of a noise head must agree.
    const std::vector<float> q = m.weight_f32(p + "attn.q_proj.weight");
    std::vector<float> hq(static_cast<size_t>(L.H * d * C));
    std::vector<char> seen(static_cast<size_t>(L.H * d), 0);
    for (int64_t r = 0; r < s.n_q(); ++r) {
      const int64_t dst = perm.q_src(r);
      const float* src = &q[static_cast<size_t>(r * C)];
      float* o = &hq[static_cast<size_t>(dst * C)];
      if (seen[static_cast<size_t>(dst)] &&
          std::memcmp(o, src, sizeof(float) * static_cast<size_t>(C)) != 0) {
        throw InvalidArgument("layer " + std::to_string(l) + ": the pairs sharing noise head " +
                              std::to_string(dst / d) + " hold different copies of it (noise_share = " +
                              std::to_string(c.noise_share) + "); Motif-2 stores one");
      }
      std::memcpy(o, src, sizeof(float) * static_cast<size_t>(C));
      seen[static_cast<size_t>(dst)] = 1;
    }
    put(hf + "self_attn.q_proj.weight", {L.H * d, C}, std::move(hq));
    const std::vector<float> k = m.weight_f32(p + "attn.k_proj.weight");
    std::vector<float> hk(k.size());
    for (int64_t r = 0; r < L.Hkv * d; ++r) {
      std::memcpy(&hk[static_cast<size_t>(perm.k_src(r) * C)], &k[static_cast<size_t>(r * C)],
                  sizeof(float) * static_cast<size_t>(C));
    }
    put(hf + "self_attn.k_proj.weight", {L.Hkv * d, C}, std::move(hk));
    put(hf + "self_attn.v_proj.weight", {L.Hkv * d, C}, m.weight_f32(p + "attn.v_proj.weight"));
    put(hf + "self_attn.o_proj.weight", {C, s.n_out()}, m.weight_f32(p + "attn.out_proj.weight"));
    for (const char* n : {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"}) {
      put(hf + "self_attn." + n, {d}, m.weight_f32(p + "attn." + n));
    }
    put(hf + "self_attn.subln.weight", {2 * d}, m.weight_f32(p + "attn.subln.weight"));
    put(hf + "post_attention_layernorm.weight", {C}, m.weight_f32(p + "ffn_norm.weight"));
    put(hf + "mlp.gate_proj.weight", {c.ffn_dim, C}, m.weight_f32(p + "ffn.gate_proj.weight"));
    put(hf + "mlp.up_proj.weight", {c.ffn_dim, C}, m.weight_f32(p + "ffn.up_proj.weight"));
    put(hf + "mlp.down_proj.weight", {C, c.ffn_dim}, m.weight_f32(p + "ffn.down_proj.weight"));
    put(hf + "mlp.act_fn.weight", {3}, m.weight_f32(p + "ffn.act_fn.weight"));
    put(hf + "mlp.act_fn.bias", {1}, m.weight_f32(p + "ffn.act_fn.bias"));
  }
  put("model.norm.weight", {C}, m.weight_f32("norm.weight"));
  if (!c.tie_embeddings) put("lm_head.weight", {c.vocab_size, C}, m.weight_f32("lm_head.weight"));

  // config.json in the published spelling (docs/models/motif2.md, "config.json")
  j["architectures"] = {"MotifForCausalLM"};
  j["model_type"] = "Motif";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = C;
  j["intermediate_size"] = c.ffn_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = L.H;
  j["num_key_value_heads"] = L.Hkv;
  j["head_dim"] = d;
  if (L.S > 2) {
    j["num_noise_heads"] = L.G;
    j["k_ratio"] = 1;
  }
  j["hidden_act"] = "poly_norm";
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["attn_rms_norm_eps"] = c.subln_eps ? *c.subln_eps : c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["use_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype_name(dtype);
  return write_hf_dir(out, j, dir, dtype, shards, files);
}

}  // namespace

const ArchFamily kMotifFamily = {
    "Motif",
    // Motif's own config spells it "Motif"; mlx ports lower-case it.
    [](const std::string& t) {
      std::string l = t;
      for (char& ch : l) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      return l == "motif";
    },
    translate,
    load_llama_like,
    [](const ModelConfig& c) { return c.mlp == MlpKind::PolyNorm; },
    save,
};

}  // namespace diffattn::model
