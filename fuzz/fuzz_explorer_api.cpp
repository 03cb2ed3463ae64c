// Fuzzes the explorer's API (src/explorer/api.cpp) without sockets: explorer::handle(method, path,
// body) with a tiny byte-level DIFF V1 model loaded as source "model". The input is
// "METHOD PATH\nBODY". handle() must answer everything (it never throws), and every JSON
// response must be valid UTF-8 JSON with an "error" field when the status is not 200.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "diffattn/explorer/explorer.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/config.h"
#include "diffattn/model/model.h"

namespace {

// The model's directory, removed when the fuzzer exits.
char g_dir[] = "/tmp/fuzz_explorer_api.XXXXXX";

void remove_model_dir() {
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
}

void tiny_model_dir() {
  if (::mkdtemp(g_dir) == nullptr) std::abort();
  std::atexit(remove_model_dir);
  const char* dir = g_dir;
  diffattn::model::ModelConfig c;
  c.attention = diffattn::nn::AttnKind::DiffV1;
  c.vocab_size = 256;
  c.d_model = 16;
  c.n_layers = 1;
  c.n_heads = 1;
  c.n_kv_heads = 1;
  c.head_dim = 8;
  c.ffn_dim = 16;
  c.max_seq_len = 32;
  diffattn::model::Model m(c);
  m.init_weights(1);
  diffattn::model::save_model(m, dir);
  diffattn::explorer::add_model(dir);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tiny_model_dir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t sp = in.find(' '), nl = in.find('\n');
  std::string method = "POST", path = "/api/views", body = in;
  if (sp != std::string::npos && nl != std::string::npos && sp < nl) {
    method = in.substr(0, sp);
    path = in.substr(sp + 1, nl - sp - 1);
    body = in.substr(nl + 1);
  }
  const diffattn::explorer::Response r = diffattn::explorer::handle(method, path, body);
  if (r.content_type == "application/json") {
    // Throws (and so crashes the fuzzer) on invalid JSON or invalid UTF-8.
    const nlohmann::json j = nlohmann::json::parse(r.body);
    if (r.status != 200 && !(j.is_object() && j.contains("error") && j["error"].is_string())) {
      std::fprintf(stderr, "status %d without an error message: %s\n", r.status, r.body.c_str());
      std::abort();
    }
  } else if (r.status != 200) {
    std::abort();
  }
  return 0;
}
