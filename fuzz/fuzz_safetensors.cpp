// Fuzzes the safetensors reader (src/model/safetensors.cpp) in memory: parse_safetensors (header
// length, JSON header, dtypes, shapes, offsets, decoding) and the header alone. Any input either
// parses, with every tensor's data as long as its shape says and the tensors tiling the data
// exactly (no gap, no overlap, no tail: the safetensors library's rule), or throws a
// diffattn::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>
#include <algorithm>

#include "diffattn/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const diffattn::model::SafeTensorsHeader h = diffattn::model::parse_safetensors_header(bytes, "fuzz.safetensors");
    const diffattn::model::SafeTensorsFile f = diffattn::model::parse_safetensors(bytes, "fuzz.safetensors");
    if (f.tensors.size() != h.tensors.size()) std::abort();
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const auto& [name, e] : h.tensors) ranges.push_back({e.begin, e.end});
    std::sort(ranges.begin(), ranges.end());
    uint64_t at = 0;
    for (const auto& [b, e] : ranges) {
      if (b != at) std::abort();
      at = e;
    }
    if (h.data_offset + at != bytes.size()) std::abort();
    for (const auto& [name, t] : f.tensors) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;  // checked by the reader: cannot overflow here
      if (static_cast<int64_t>(t.data.size()) != n || h.tensors.at(name).numel != n) std::abort();
    }
  } catch (const diffattn::Error&) {
  }
  return 0;
}
