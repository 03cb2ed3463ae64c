// Pieces of config.json parsing shared by the project's format (config.cpp) and the Hugging Face
// readers (arch_*.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "diffattn/model/config.h"
#include "diffattn/nn/layers.h"

namespace diffattn::model {

// A rope_scaling object ({"rope_type" (or "type"): "default" | "linear" | "llama3", "factor",
// "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}); other rope types
// are errors naming `where` and the type. Keys it does not use are ignored (rope_parameters
// carries rope_theta beside them).
nn::RopeScaling parse_rope_scaling(const nlohmann::json& r, const std::string& where);

// The project's config.json (docs/FORMAT.md) from its parsed object: ModelConfig::from_json
// after parsing, and the project family's translation (arch_diffattn.cpp).
ModelConfig config_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace diffattn::model
