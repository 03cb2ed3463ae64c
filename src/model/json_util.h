// JSON helpers shared by the files that read diffattn's JSON (config.json, training options,
// the CLI's --config): one place that turns bad text into an error naming its source.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "diffattn/error.h"

namespace diffattn {

// Parses text that must hold a JSON object; `where` (a file, a key) starts every error.
inline nlohmann::json parse_json_object(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw InvalidArgument(where + ": expected a JSON object");
  return j;
}

}  // namespace diffattn
