// Phi-4-mini-flash (model_type "phi4flash"; docs/models/phi4flash.md), the SambaY hybrid:
// Mamba, sliding-window and full differential attention, and gated memory units, read with
// every tensor under its published name (the tensor table's name after "model."), matrices
// where they lie in the mapped files; no permutation: the published differential attention is
// the project's diff_v1 operator as it is (adjacent query pairs, key pairs, value
// [v_2g | v_2g+1]). Read only: the model runs from its published directory.
#include <nlohmann/json.hpp>

#include "diffattn/base/json_util.h"
#include "model/arch.h"

namespace diffattn::model {

using json = nlohmann::json;

namespace {

// Phi-4-mini-flash's config.json (docs/models/phi4flash.md, "config.json"): the keys whose class
// defaults differ from the published values are required; the mamba_* keys take the class's
// defaults; what the published modeling file would read differently is refused.
ModelConfig translate(const ConfigKeys& k, ArchLayout& L) {
  const json& j = k.json();
  const std::string& where = k.where();
  L.sambay = true;
  if (k.has("hidden_act") && j.at("hidden_act") != "silu") k.refuse("hidden_act", "the MLP is SwiGLU: \"silu\"");
  if (k.integer_or("mb_per_layer", 2) != 2) k.refuse("mb_per_layer", "the published code's layer pattern assumes 2");
  for (const char* key : {"mlp_bias", "lm_head_bias", "mamba_proj_bias"}) {
    if (k.boolean_or(key, false)) k.refuse(key, "the published code has no such bias");
  }
  if (!k.boolean_or("mamba_conv_bias", true)) k.refuse("mamba_conv_bias", "the published code always has the conv bias");
  if (!k.boolean_or("tie_word_embeddings", true)) k.refuse("tie_word_embeddings", "the published model ties its head to the embedding");
  const int64_t C = k.integer("hidden_size"), H = k.integer("num_attention_heads");
  const int64_t G = k.integer("num_key_value_heads");
  if (C % H != 0 || H % 2 != 0 || G % 2 != 0 || H % G != 0) {
    throw InvalidArgument(where + ": num_attention_heads = " + std::to_string(H) + " must divide hidden_size = " +
                          std::to_string(C) + ", and it and num_key_value_heads = " + std::to_string(G) +
                          " must be even, the latter dividing the former (heads pair up)");
  }
  if (k.has("sliding_window") && !j.at("sliding_window").is_number_integer()) {
    k.refuse("sliding_window", "one window size for the sliding-window layers, an integer");
  }
  ModelConfig c;
  c.arch = Arch::SambaY;
  c.attention = nn::AttnKind::DiffV1;
  c.vocab_size = k.integer("vocab_size");
  c.d_model = C;
  c.n_layers = k.integer("num_hidden_layers");
  c.ffn_dim = k.integer("intermediate_size");
  c.n_heads = H / 2;
  c.n_kv_heads = G / 2;
  c.head_dim = C / H;
  c.max_seq_len = k.integer_or("max_position_embeddings", 4096);
  c.norm_eps = static_cast<float>(k.number_or("layer_norm_eps", 1e-5));
  c.subln_eps = 1e-5f;  // fixed in the modeling code
  c.tie_embeddings = true;
  c.attn_bias = true;
  c.sambay.d_state = k.integer_or("mamba_d_state", 16);
  c.sambay.d_conv = k.integer_or("mamba_d_conv", 4);
  c.sambay.expand = k.integer_or("mamba_expand", 2);
  c.sambay.dt_rank = (C + 15) / 16;
  if (k.has("mamba_dt_rank") && !(j.at("mamba_dt_rank") == "auto" ||
                                (j.at("mamba_dt_rank").is_number_integer() &&
                                 j.at("mamba_dt_rank").get<int64_t>() == c.sambay.dt_rank))) {
    k.refuse("mamba_dt_rank", "the published code uses ceil(hidden_size / 16) = " + std::to_string(c.sambay.dt_rank));
  }
  c.sambay.window = k.integer("sliding_window");
  c.validate(where);  // the layer pattern's L % 4 == 0 among the rest
  return c;
}
}  // namespace

const ArchFamily kPhi4FlashFamily = {
    "phi4flash",
    [](const std::string& t) { return t == "phi4flash"; },
    translate,
    load_sambay_weights,
    [](const ModelConfig&) { return false; },
    nullptr,
};

}  // namespace diffattn::model
