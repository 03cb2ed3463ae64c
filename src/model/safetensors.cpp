// The safetensors format: an 8-byte little-endian header length, a JSON header mapping each
// tensor name to {dtype, shape, data_offsets} (offsets relative to the data after the header)
// plus an optional "__metadata__" string map, then the raw little-endian data.
// We write F32; we read F32, BF16 and F16 (converted to float32). Every check names the file
// and the tensor. Files are written atomically.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "diffattn/model.h"
#include "model/json_util.h"

namespace diffattn {

using json = nlohmann::json;

namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal
  } else if (exp == 31) {
    f = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    f = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafeTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  uint64_t off = 0;
  for (const SafeTensorRef& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const uint64_t bytes = static_cast<uint64_t>(n) * 4;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // data starts 8-byte aligned
  std::string out(8, '\0');
  const uint64_t hl = h.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((hl >> (8 * i)) & 0xff);
  out += h;
  out.reserve(out.size() + off);
  for (const SafeTensorRef& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    out.append(reinterpret_cast<const char*>(t.data), static_cast<size_t>(n) * 4);
  }
  write_file_atomic(path, out);
}

SafeTensorsFile read_safetensors(const std::string& path) {
  const std::string bytes = read_file(path);
  if (bytes.size() < 8) {
    throw IoError(path + ": truncated: " + std::to_string(bytes.size()) +
                  " bytes, shorter than the 8-byte safetensors header length");
  }
  uint64_t hl = 0;
  for (int i = 0; i < 8; ++i) hl |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)])) << (8 * i);
  if (hl > bytes.size() - 8) {
    throw IoError(path + ": header length " + std::to_string(hl) + " exceeds the file's " +
                  std::to_string(bytes.size() - 8) + " remaining bytes (truncated or not safetensors)");
  }
  json header;
  try {
    header = parse_json_bounded(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(hl),
                                path + ": corrupted safetensors header");
  } catch (const InvalidArgument& e) {
    throw IoError(e.what());
  }
  if (!header.is_object()) throw IoError(path + ": corrupted safetensors header (not an object)");
  const uint64_t data_size = bytes.size() - 8 - hl;
  const char* data = bytes.data() + 8 + hl;
  SafeTensorsFile f;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw IoError(path + ": __metadata__ must be an object of strings");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) throw IoError(path + ": __metadata__[\"" + k + "\"] is not a string");
        f.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor \"" + name + "\"";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets")) {
      throw IoError(where + ": entry needs dtype, shape and data_offsets");
    }
    SafeTensor t;
    const json& dt = v.at("dtype");
    const std::string dts = dt.is_string() ? dt.get<std::string>() : json_brief(dt);
    size_t esize = 4;
    if (dts == "F32") {
      t.dtype = DType::F32;
    } else if (dts == "BF16") {
      t.dtype = DType::BF16;
      esize = 2;
    } else if (dts == "F16") {
      t.dtype = DType::F16;
      esize = 2;
    } else {
      throw IoError(where + ": dtype " + dts + " is not supported (F32, BF16 or F16)");
    }
    int64_t n = 1;
    if (!v.at("shape").is_array()) throw IoError(where + ": shape is not a list");
    for (const json& d : v.at("shape")) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        throw IoError(where + ": shape " + json_brief(v.at("shape")) + " is not a list of sizes");
      }
      t.shape.push_back(d.get<int64_t>());
      n *= d.get<int64_t>();
    }
    const json& offs = v.at("data_offsets");
    if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() ||
        !offs[1].is_number_unsigned()) {
      throw IoError(where + ": data_offsets " + json_brief(offs) + " is not [begin, end]");
    }
    const uint64_t b = offs[0].get<uint64_t>(), e = offs[1].get<uint64_t>();
    if (b > e || e > data_size) {
      throw IoError(where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                    "] fall outside the " + std::to_string(data_size) +
                    " data bytes (truncated file?)");
    }
    if (e - b != static_cast<uint64_t>(n) * esize) {
      throw IoError(where + ": holds " + std::to_string(e - b) + " bytes, but " + dts + " of shape " +
                    shape_str(t.shape) + " needs " + std::to_string(static_cast<uint64_t>(n) * esize));
    }
    ranges.push_back({b, e});
    t.data.resize(static_cast<size_t>(n));
    const char* src = data + b;
    for (int64_t i = 0; i < n; ++i) {
      if (t.dtype == DType::F32) {
        std::memcpy(&t.data[static_cast<size_t>(i)], src + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        t.data[static_cast<size_t>(i)] = t.dtype == DType::BF16 ? bf16_to_float(h) : half_to_float(h);
      }
    }
    f.tensors.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      throw IoError(path + ": corrupted safetensors header (tensor data ranges overlap)");
    }
  }
  return f;
}

}  // namespace diffattn
