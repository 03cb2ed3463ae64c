// Writing a model as a transformers directory (the families' `save`, src/model/arch.h): the
// tensors in shards of about equal bytes, their index, config.json and generation_config.json,
// all swapped in as one (DirectoryUpdate).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "diffattn/base/files.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/safetensors.h"
#include "model/arch.h"
#include "model/dir_commit.h"

namespace diffattn::model {

using json = nlohmann::json;

const char* torch_dtype_name(DType dtype) {
  return dtype == DType::F32 ? "float32" : dtype == DType::BF16 ? "bfloat16" : "float16";
}

std::string write_hf_dir(const HfTensors& out, const json& j, const std::string& dir, DType dtype,
                         int64_t shards, const ModelFiles& files) {
  // The whole directory is written beside DIR and swapped in (DirectoryUpdate): shards of about
  // equal bytes, in the order above, their index, the configs.
  DirectoryUpdate u(dir);
  int64_t total = 0;
  for (const auto& t : out) total += static_cast<int64_t>(t.second.second.size());
  const int64_t n_files = std::min<int64_t>(shards, static_cast<int64_t>(out.size()));
  // Tensor i goes to file_of[i]: a file is closed once it holds its share of the bytes, as
  // long as every later file still gets a tensor.
  std::vector<int64_t> file_of(out.size());
  {
    int64_t f = 0, bytes = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const int64_t left = static_cast<int64_t>(out.size() - i);
      if (bytes > 0 && f + 1 < n_files &&
          (bytes * n_files >= total || left <= n_files - f - 1)) {
        ++f;
        bytes = 0;
      }
      file_of[i] = f;
      bytes += static_cast<int64_t>(out[i].second.second.size());
    }
  }
  json weight_map = json::object();
  for (int64_t f = 0; f < n_files; ++f) {
    char name[64];
    if (n_files == 1) {
      std::snprintf(name, sizeof name, "model.safetensors");
    } else {
      std::snprintf(name, sizeof name, "model-%05lld-of-%05lld.safetensors",
                    static_cast<long long>(f + 1), static_cast<long long>(n_files));
    }
    std::vector<SafeTensorRef> refs;
    for (size_t i = 0; i < out.size(); ++i) {
      if (file_of[i] != f) continue;
      refs.push_back({out[i].first, out[i].second.first, out[i].second.second.data()});
      weight_map[out[i].first] = name;
    }
    write_safetensors(u.path(name), refs, {{"format", "pt"}}, dtype);
  }
  if (n_files > 1) {
    json index = {{"metadata", {{"total_size", total * static_cast<int64_t>(dtype_size(dtype))}}},
                  {"weight_map", weight_map}};
    u.write("model.safetensors.index.json", index.dump(2) + "\n");
  }
  u.write("generation_config.json", json{{"_from_model_config", true}}.dump(2) + "\n");
  u.write("config.json", j.dump(2) + "\n");
  return commit_model_dir(u, dir, files);
}

}  // namespace diffattn::model
