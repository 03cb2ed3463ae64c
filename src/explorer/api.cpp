// The explorer's JSON API (explorer.h): validates every field with a message that names it,
// computes the views with the library (views.h) and returns them as JSON.
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "diffattn/explorer.h"
#include "diffattn/views.h"
#include "explorer/assets.h"

namespace diffattn::explorer {

namespace {

using nlohmann::json;

struct BadRequest {
  std::string message;
};

json matrix(const std::vector<float>& m, int64_t rows, int64_t cols) {
  json out = json::array();
  for (int64_t i = 0; i < rows; ++i) {
    json row = json::array();
    for (int64_t j = 0; j < cols; ++j) row.push_back(m[static_cast<size_t>(i * cols + j)]);
    out.push_back(std::move(row));
  }
  return out;
}

double number_field(const json& j, const char* key, double def, double lo, double hi) {
  if (!j.contains(key)) return def;
  if (!j[key].is_number()) {
    throw BadRequest{std::string("\"") + key + "\" must be a number, got " + j[key].dump()};
  }
  const double v = j[key].get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    throw BadRequest{std::string("\"") + key + "\" must be between " + json(lo).dump() + " and " +
                     json(hi).dump() + ", got " + j[key].dump()};
  }
  return v;
}

int64_t int_field(const json& j, const char* key, int64_t def, int64_t lo, int64_t hi) {
  if (!j.contains(key)) return def;
  if (!j[key].is_number_integer()) {
    throw BadRequest{std::string("\"") + key + "\" must be an integer, got " + j[key].dump()};
  }
  const int64_t v = j[key].get<int64_t>();
  if (v < lo || v > hi) {
    throw BadRequest{std::string("\"") + key + "\" must be between " + std::to_string(lo) +
                     " and " + std::to_string(hi) + ", got " + std::to_string(v)};
  }
  return v;
}

json info() {
  return {{"sources", {"textbook", "random"}},
          {"limits",
           {{"max_body_bytes", kMaxBodyBytes},
            {"max_length", kMaxLength},
            {"max_head_dim", kMaxHeadDim},
            {"max_prompt_bytes", kMaxPromptBytes},
            {"max_abs_lambda", kMaxAbsLambda}}},
          {"defaults",
           {{"source", "textbook"},
            {"lambda", 0.4},
            {"mode", "signed"},
            {"causal", false},
            {"length", 12},
            {"head_dim", 4},
            {"seed", 0}}}};
}

json views(const std::string& body) {
  json req;
  try {
    req = json::parse(body.empty() ? std::string("{}") : body);
  } catch (const json::parse_error& e) {
    throw BadRequest{std::string("the body is not valid JSON: ") + e.what()};
  }
  if (!req.is_object()) throw BadRequest{"the body must be a JSON object"};
  const std::set<std::string> known = {"source", "lambda", "mode", "causal",
                                       "length", "head_dim", "seed", "prompt"};
  for (const auto& [key, value] : req.items()) {
    if (!known.count(key)) throw BadRequest{"unknown field \"" + key + "\""};
  }
  std::string source = "textbook";
  if (req.contains("source")) {
    if (!req["source"].is_string()) throw BadRequest{"\"source\" must be a string"};
    source = req["source"].get<std::string>();
    if (source != "textbook" && source != "random") {
      throw BadRequest{"\"source\" must be \"textbook\" or \"random\", got \"" + source + "\""};
    }
  }
  if (req.contains("prompt")) {
    if (!req["prompt"].is_string()) throw BadRequest{"\"prompt\" must be a string"};
    if (req["prompt"].get<std::string>().size() > kMaxPromptBytes) {
      throw BadRequest{"\"prompt\" is longer than " + std::to_string(kMaxPromptBytes) + " bytes"};
    }
    throw BadRequest{"\"prompt\" needs a trained model; source \"" + source + "\" takes none"};
  }
  const float lambda =
      static_cast<float>(number_field(req, "lambda", 0.4, -kMaxAbsLambda, kMaxAbsLambda));
  DiffMode mode = DiffMode::Signed;
  if (req.contains("mode")) {
    if (!req["mode"].is_string()) throw BadRequest{"\"mode\" must be a string"};
    const std::string m = req["mode"].get<std::string>();
    if (m == "clamp") {
      mode = DiffMode::Clamp;
    } else if (m != "signed") {
      throw BadRequest{"\"mode\" must be \"signed\" or \"clamp\", got \"" + m + "\""};
    }
  }
  bool causal = false;
  if (req.contains("causal")) {
    if (!req["causal"].is_boolean()) throw BadRequest{"\"causal\" must be true or false"};
    causal = req["causal"].get<bool>();
  }
  AttentionViews v;
  if (source == "random") {
    const int64_t length = int_field(req, "length", 12, 1, kMaxLength);
    const int64_t head_dim = int_field(req, "head_dim", 4, 1, kMaxHeadDim);
    const int64_t seed = int_field(req, "seed", 0, 0, int64_t{1} << 53);
    v = random_views(length, head_dim, static_cast<uint64_t>(seed), lambda, mode, causal);
  } else {
    for (const char* k : {"length", "head_dim", "seed"}) {
      if (req.contains(k)) throw BadRequest{std::string("\"") + k + "\" applies to source \"random\" only"};
    }
    v = textbook_views(lambda, mode, causal);
  }
  return {{"source", v.source},
          {"tokens", v.tokens},
          {"lambda", v.lambda},
          {"mode", mode == DiffMode::Signed ? "signed" : "clamp"},
          {"causal", v.causal},
          {"views",
           {{"map1", matrix(v.map1, v.T, v.T)},
            {"map2", matrix(v.map2, v.T, v.T)},
            {"diff", matrix(v.diff, v.T, v.T)},
            {"standard", matrix(v.standard, v.T, v.T)}}},
          {"outputs",
           {{"diff", matrix(v.out_diff, v.T, v.Dv)}, {"standard", matrix(v.out_standard, v.T, v.Dv)}}}};
}

}  // namespace

Response error_response(int status, const std::string& message) {
  return {status, "application/json", json{{"error", message}}.dump()};
}

Response handle(const std::string& method, const std::string& path, const std::string& body) {
  if (body.size() > kMaxBodyBytes) {
    return error_response(413, "the body is " + std::to_string(body.size()) +
                                   " bytes; the limit is " + std::to_string(kMaxBodyBytes));
  }
  for (const Asset& a : assets()) {
    if (path == a.path) {
      if (method != "GET" && method != "HEAD") return error_response(405, path + " takes GET");
      return {200, a.content_type, std::string(a.data, a.size)};
    }
  }
  try {
    if (path == "/api/info") {
      if (method != "GET") return error_response(405, "/api/info takes GET");
      return {200, "application/json", info().dump()};
    }
    if (path == "/api/views") {
      if (method != "POST") return error_response(405, "/api/views takes POST with a JSON body");
      return {200, "application/json", views(body).dump()};
    }
  } catch (const BadRequest& e) {
    return error_response(400, e.message);
  } catch (const std::exception& e) {
    // The library rejected something the checks above let through: still the caller's input.
    return error_response(400, e.what());
  }
  return error_response(404, "no such page: " + path);
}

}  // namespace diffattn::explorer
