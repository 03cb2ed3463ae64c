// The explorer's JSON API (explorer.h): validates every field with a message that names it,
// computes the views with the library (views.h) and returns them as JSON.
#include <cmath>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "diffattn/base/json_util.h"
#include "diffattn/eval/experiment.h"
#include "diffattn/eval/inspect.h"
#include "diffattn/eval/views.h"
#include "diffattn/explorer/explorer.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/train_context.h"
#include "diffattn/train/train.h"
#include "explorer/assets.h"

namespace diffattn::explorer {

namespace {

using nlohmann::json;

struct BadRequest {
  std::string message;
};

// JSON text of j; any string that is not valid UTF-8 has its bad bytes replaced by U+FFFD, so
// output is always valid UTF-8 and dumping never throws.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Offset of the first byte that does not start or continue a well-formed UTF-8 sequence
// (overlong forms, surrogates and code points above U+10FFFF included), or npos.
size_t utf8_error_at(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) { len = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned b = p[i + k];
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return i;
    }
    i += len;
  }
  return std::string::npos;
}

// Labels of the prompt's tokens: the token's text when it is valid UTF-8 on its own; a
// byte-level model splits a non-ASCII character into bytes, each shown as <0xNN>.
std::string token_label(const std::string& text) {
  if (utf8_error_at(text) == std::string::npos) return text;
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : text) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      out += "<0x";
      out += hex[c >> 4];
      out += hex[c & 15];
      out += '>';
    }
  }
  return out;
}

// A request path as it may appear in a message: printable ASCII kept, anything else as %XX,
// and at most 200 bytes of it.
std::string printable_path(const std::string& path) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : path.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return path.size() > 200 ? out + "..." : out;
}

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
    throw BadRequest{std::string("\"") + key + "\" must be a number, got " + json_brief(j[key])};
  }
  const double v = j[key].get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    throw BadRequest{std::string("\"") + key + "\" must be between " + json(lo).dump() + " and " +
                     json(hi).dump() + ", got " + json_brief(j[key])};
  }
  return v;
}

int64_t int_field(const json& j, const char* key, int64_t def, int64_t lo, int64_t hi) {
  if (!j.contains(key)) return def;
  if (!j[key].is_number_integer()) {
    throw BadRequest{std::string("\"") + key + "\" must be an integer, got " + json_brief(j[key])};
  }
  const int64_t v = j[key].get<int64_t>();
  if (v < lo || v > hi) {
    throw BadRequest{std::string("\"") + key + "\" must be between " + std::to_string(lo) +
                     " and " + std::to_string(hi) + ", got " + std::to_string(v)};
  }
  return v;
}

// A model offered by `explore --model DIR`.
// The prompt a model's controls start with: for a model of `experiment retrieval` (its
// DIR/retrieval.json), a held-out sample of its task that fits the prompt bound; else a sentence.
std::string example_prompt(const std::string& dir, int64_t max_tokens) {
  const std::optional<data::RetrievalSpec> task = data::read_retrieval_spec(dir);
  if (!task) return "The cat sat on the mat. The cat sat on the";
  data::RetrievalSpec s = eval::heldout(*task);
  s.min_context = 0;
  s.context = std::min(s.context, max_tokens - s.queries * s.query_len());
  try {
    return data::make_retrieval_sample(s, 0).text();
  } catch (const InvalidArgument&) {  // the bound leaves too little room for the needles
    return "The cat sat on the mat. The cat sat on the";
  }
}

struct LoadedModel {
  explicit LoadedModel(const std::string& d) : LoadedModel(model::open_model_dir(d)) {}
  explicit LoadedModel(const model::ModelDir& d)
      : dir(d.path), model(model::load_model(d)), tok(data::tokenizer_for(d)),
        prompt(example_prompt(d.path, std::min<int64_t>(kMaxPromptTokens, model.config().max_seq_len))) {}
  std::string dir;
  const model::Model model;
  std::unique_ptr<data::Tokenizer> tok;
  std::string prompt;
};

std::vector<std::unique_ptr<LoadedModel>>& loaded_models() {
  static std::vector<std::unique_ptr<LoadedModel>> models;
  return models;
}

json model_info(const LoadedModel& lm, size_t index) {
  const model::ModelConfig& c = lm.model.config();
  return {{"index", index},
          {"dir", lm.dir},
          {"name", lm.dir.substr(lm.dir.find_last_of('/', lm.dir.size() > 1 ? lm.dir.size() - 2 : 0) + 1)},
          {"kind", nn::attn_kind_name(c.attention)},
          {"layers", c.n_layers},
          {"heads", c.n_heads},
          {"max_tokens", std::min<int64_t>(kMaxPromptTokens, c.max_seq_len)},
          {"example_prompt", lm.prompt}};
}

json info() {
  json models = json::array();
  for (size_t i = 0; i < loaded_models().size(); ++i) models.push_back(model_info(*loaded_models()[i], i));
  json sources = {"textbook", "random"};
  if (!models.empty()) sources.push_back("model");
  return {{"sources", sources},
          {"models", models},
          {"limits",
           {{"max_body_bytes", kMaxBodyBytes},
            {"max_length", kMaxLength},
            {"max_head_dim", kMaxHeadDim},
            {"max_prompt_bytes", kMaxPromptBytes},
            {"max_prompt_tokens", kMaxPromptTokens},
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

json nullable_matrix(const std::vector<float>& m, int64_t T) {
  return m.empty() ? json(nullptr) : matrix(m, T, T);
}

// The source "model": one head (or the head mean) of one layer of a loaded model on a prompt.
json model_views(const json& req, float lambda, bool lambda_given, kernels::DiffMode mode) {
  auto& models = loaded_models();
  if (models.empty()) throw BadRequest{"\"source\": \"model\" needs a model: start the server with --model DIR"};
  const int64_t idx = int_field(req, "model", 0, 0, static_cast<int64_t>(models.size()) - 1);
  LoadedModel& lm = *models[static_cast<size_t>(idx)];
  const model::ModelConfig& c = lm.model.config();
  if (req.contains("causal") && req["causal"] != json(true)) {
    throw BadRequest{"\"causal\": a model's attention is always causal"};
  }
  for (const char* k : {"length", "head_dim", "seed"}) {
    if (req.contains(k)) throw BadRequest{std::string("\"") + k + "\" applies to source \"random\" only"};
  }
  if (!req.contains("prompt") || !req["prompt"].is_string()) throw BadRequest{"\"prompt\" (a string) is required for source \"model\""};
  const std::string prompt = req["prompt"].get<std::string>();
  const std::vector<int32_t> ids = lm.tok->encode(prompt);
  const int64_t max_tokens = std::min<int64_t>(kMaxPromptTokens, c.max_seq_len);
  if (ids.empty()) throw BadRequest{"\"prompt\" is empty"};
  if (static_cast<int64_t>(ids.size()) > max_tokens) {
    throw BadRequest{"\"prompt\" is " + std::to_string(ids.size()) + " tokens; the limit is " + std::to_string(max_tokens)};
  }
  const int64_t layer = int_field(req, "layer", c.n_layers - 1, 0, c.n_layers - 1);
  const int64_t head = int_field(req, "head", 0, -1, c.n_heads - 1);
  std::vector<std::string> labels;
  for (int32_t id : ids) labels.push_back(token_label(lm.tok->decode({id})));
  eval::MapOptions mo;
  mo.mode = mode;
  if (lambda_given) mo.lambda = lambda;
  eval::AttentionViews v;
  {
    // The request's own run state: concurrent requests share the const model, no lock.
    model::TrainContext run(lm.model);
    run.forward(ids.data(), nullptr, 1, static_cast<int64_t>(ids.size()));
    v = eval::head_views(eval::layer_maps(run, layer, 0, mo), head, labels);
  }
  return {{"source", "model"},
          {"model", idx},
          {"kind", nn::attn_kind_name(c.attention)},
          {"layer", layer},
          {"head", head},
          {"tokens", v.tokens},
          {"lambda", v.lambda},
          {"lambda_learned", !lambda_given || c.attention == nn::AttnKind::Standard},
          {"lambda_varies", v.lambda_varies},
          {"mode", kernels::diff_mode_name(mode)},
          {"causal", true},
          {"views",
           {{"map1", nullable_matrix(v.map1, v.T)},
            {"map2", nullable_matrix(v.map2, v.T)},
            {"diff", nullable_matrix(v.diff, v.T)},
            {"standard", nullable_matrix(v.standard, v.T)}}}};
}

json views(const std::string& body) {
  if (const size_t at = utf8_error_at(body); at != std::string::npos) {
    throw BadRequest{"the body is not valid UTF-8 (byte " + std::to_string(at) + ")"};
  }
  json req;
  try {
    req = parse_json_bounded(body.empty() ? std::string("{}") : body, "the body");
  } catch (const InvalidArgument& e) {
    throw BadRequest{e.what()};
  }
  if (!req.is_object()) throw BadRequest{"the body must be a JSON object"};
  const std::set<std::string> known = {"source", "lambda", "mode", "causal", "length", "head_dim",
                                       "seed", "prompt", "model", "layer", "head"};
  for (const auto& [key, value] : req.items()) {
    if (!known.count(key)) throw BadRequest{"unknown field \"" + key + "\""};
  }
  std::string source = "textbook";
  if (req.contains("source")) {
    if (!req["source"].is_string()) throw BadRequest{"\"source\" must be a string"};
    source = req["source"].get<std::string>();
    if (source != "textbook" && source != "random" && source != "model") {
      throw BadRequest{"\"source\" must be \"textbook\", \"random\" or \"model\", got \"" + source + "\""};
    }
  }
  if (req.contains("prompt")) {
    if (!req["prompt"].is_string()) throw BadRequest{"\"prompt\" must be a string"};
    if (req["prompt"].get<std::string>().size() > kMaxPromptBytes) {
      throw BadRequest{"\"prompt\" is longer than " + std::to_string(kMaxPromptBytes) + " bytes"};
    }
    if (source != "model") throw BadRequest{"\"prompt\" needs a trained model; source \"" + source + "\" takes none"};
  }
  if (source != "model") {
    for (const char* k : {"model", "layer", "head"}) {
      if (req.contains(k)) throw BadRequest{std::string("\"") + k + "\" applies to source \"model\" only"};
    }
  }
  const float lambda =
      static_cast<float>(number_field(req, "lambda", 0.4, -kMaxAbsLambda, kMaxAbsLambda));
  kernels::DiffMode mode = kernels::DiffMode::Signed;
  if (req.contains("mode")) {
    if (!req["mode"].is_string()) throw BadRequest{"\"mode\" must be a string"};
    try {
      mode = kernels::parse_diff_mode(req["mode"].get<std::string>(), "\"mode\"");
    } catch (const InvalidArgument& e) {
      throw BadRequest{e.what()};
    }
  }
  if (source == "model") return model_views(req, lambda, req.contains("lambda"), mode);
  bool causal = false;
  if (req.contains("causal")) {
    if (!req["causal"].is_boolean()) throw BadRequest{"\"causal\" must be true or false"};
    causal = req["causal"].get<bool>();
  }
  eval::AttentionViews v;
  if (source == "random") {
    const int64_t length = int_field(req, "length", 12, 1, kMaxLength);
    const int64_t head_dim = int_field(req, "head_dim", 4, 1, kMaxHeadDim);
    const int64_t seed = int_field(req, "seed", 0, 0, int64_t{1} << 53);
    v = eval::random_views(length, head_dim, static_cast<uint64_t>(seed), lambda, mode, causal);
  } else {
    for (const char* k : {"length", "head_dim", "seed"}) {
      if (req.contains(k)) throw BadRequest{std::string("\"") + k + "\" applies to source \"random\" only"};
    }
    v = eval::textbook_views(lambda, mode, causal);
  }
  return {{"source", v.source},
          {"tokens", v.tokens},
          {"lambda", v.lambda},
          {"mode", kernels::diff_mode_name(mode)},
          {"causal", v.causal},
          {"views",
           {{"map1", matrix(v.map1, v.T, v.T)},
            {"map2", matrix(v.map2, v.T, v.T)},
            {"diff", matrix(v.diff, v.T, v.T)},
            {"standard", matrix(v.standard, v.T, v.T)}}},
          {"outputs",
           {{"diff", matrix(v.out_diff, v.T, v.Dv)}, {"standard", matrix(v.out_standard, v.T, v.Dv)}}}};
}

Response handle_request(const std::string& method, const std::string& path, const std::string& body);

}  // namespace

void add_model(const std::string& dir) {
  loaded_models().push_back(std::make_unique<LoadedModel>(dir));
}

Response error_response(int status, const std::string& message) {
  return {status, "application/json", dump(json{{"error", message}})};
}

Response handle(const std::string& method, const std::string& path, const std::string& body) {
  try {
    return handle_request(method, path, body);
  } catch (const std::bad_alloc&) {
    return error_response(503, "the server is out of memory");
  } catch (...) {
    // Every input error is answered above; reaching here is a bug, still never an escape.
    return error_response(500, "internal error");
  }
}

namespace {

Response handle_request(const std::string& method, const std::string& path, const std::string& body) {
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
      return {200, "application/json", dump(info())};
    }
    if (path == "/api/views") {
      if (method != "POST") return error_response(405, "/api/views takes POST with a JSON body");
      return {200, "application/json", dump(views(body))};
    }
  } catch (const BadRequest& e) {
    return error_response(400, e.message);
  } catch (const std::exception& e) {
    // The library rejected something the checks above let through: still the caller's input.
    return error_response(400, e.what());
  }
  return error_response(404, "no such page: " + printable_path(path));
}

}  // namespace

}  // namespace diffattn::explorer
