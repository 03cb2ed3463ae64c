// The safetensors format: an 8-byte little-endian header length, a JSON header mapping each
// tensor name to {dtype, shape, data_offsets} (offsets relative to the data after the header)
// plus an optional "__metadata__" string map, then the raw little-endian data.
// We write F32; we read F32, BF16 and F16 (converted to float32 by dtype.h's convert_to_f32).
// Every check names the file and the tensor. Files are written atomically.
#include <algorithm>
#include <cstdint>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "diffattn/base/json_util.h"
#include "diffattn/base/files.h"
#include "diffattn/base/memory.h"
#include "diffattn/model/safetensors.h"

namespace diffattn::model {

using json = nlohmann::json;

void write_safetensors(const std::string& path, const std::vector<SafeTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata, DType dtype) {
  const size_t es = dtype_size(dtype);
  json header = json::object();
  uint64_t off = 0;
  for (const SafeTensorRef& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const uint64_t bytes = static_cast<uint64_t>(n) * es;
    header[t.name] = {{"dtype", dtype_name(dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
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
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(n) * es);
    convert_from_f32(&out[at], t.data, dtype, n);
  }
  write_file_atomic(path, out);
}

namespace {

// Little-endian u64 from the first 8 bytes.
uint64_t le64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

void check_prefix(uint64_t file_size, const std::string& name) {
  if (file_size < 8) {
    throw IoError(name + ": truncated: " + std::to_string(file_size) +
                  " bytes, shorter than the 8-byte safetensors header length");
  }
}

void check_header_length(uint64_t hl, uint64_t file_size, const std::string& name) {
  if (hl > kMaxSafetensorsHeaderBytes) {
    throw IoError(name + ": header length " + std::to_string(hl) + " exceeds the limit of " +
                  std::to_string(kMaxSafetensorsHeaderBytes) + " bytes (corrupted or not safetensors)");
  }
  if (hl > file_size - 8) {
    throw IoError(name + ": header length " + std::to_string(hl) + " exceeds the file's " +
                  std::to_string(file_size - 8) + " remaining bytes (truncated or not safetensors)");
  }
}

// The dtypes of the safetensors format (the reference library's list) with their sizes in bits:
// a file may name any of them; diffattn computes with F32, BF16 and F16 and refuses the others
// by name once the file is known to be well formed.
struct DtypeInfo {
  const char* name;
  uint64_t bits;
};
constexpr DtypeInfo kSafetensorsDtypes[] = {
    {"BOOL", 8}, {"F4", 4}, {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8}, {"I8", 8},
    {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16},
    {"BF16", 16}, {"I32", 32}, {"U32", 32}, {"F32", 32}, {"C64", 64}, {"F64", 64}, {"I64", 64},
    {"U64", 64}};

// Where a safetensors header may repeat a key, as the reference reader (serde) decides: a
// tensor name or a metadata key (the last wins, in both readers), but not "__metadata__" itself
// nor a field of a tensor's entry.
bool header_duplicate_allowed(const std::vector<std::string>& path, const std::string& key) {
  return (path.empty() && key != "__metadata__") || (path.size() == 1 && path[0] == "__metadata__");
}

// The JSON header text (hl bytes) of a file of file_size bytes, checked as the reference
// library (huggingface/safetensors) checks it, so a file one accepts the other accepts:
//  - the header is a JSON object (UTF-8, no NUL, no byte order mark); "__metadata__" is null or
//    an object of strings; every other key is a tensor whose entry has a dtype of the format's
//    list, a shape of unsigned integers and data_offsets of exactly two unsigned integers
//    (other fields are ignored; a repeated field is an error);
//  - sorted by data_offsets, the tensors tile the data exactly: the first begins at 0, each
//    begins where the previous one ends, the last ends at the end of the file, and each holds
//    exactly the bytes its dtype and shape need (products checked for overflow). A gap before,
//    between or after the tensors, or an overlap, is an error: no byte of the file is unread.
SafeTensorsHeader parse_header_json(const char* text, uint64_t hl, uint64_t file_size,
                                    const std::string& path) {
  json header;
  try {
    header = parse_json_bounded(text, text + hl, path + ": corrupted safetensors header",
                                header_duplicate_allowed);
  } catch (const InvalidArgument& e) {
    throw IoError(e.what());
  }
  if (!header.is_object()) throw IoError(path + ": corrupted safetensors header (not an object)");
  SafeTensorsHeader h;
  h.data_offset = 8 + hl;
  h.file_size = file_size;
  const uint64_t data_size = file_size - 8 - hl;
  struct Range {
    uint64_t begin, end;
    std::string name;
    bool operator<(const Range& o) const { return begin != o.begin ? begin < o.begin : end < o.end; }
  };
  std::vector<Range> ranges;
  std::string unsupported;  // the first tensor of a dtype diffattn does not compute with
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (v.is_null()) continue;
      if (!v.is_object()) throw IoError(path + ": __metadata__ must be an object of strings");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) throw IoError(path + ": __metadata__[" + quote_name(k) + "] is not a string");
        h.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor " + quote_name(name);
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets")) {
      throw IoError(where + ": entry needs dtype, shape and data_offsets");
    }
    SafeTensorEntry t;
    const json& dt = v.at("dtype");
    const std::string dts = dt.is_string() ? dt.get<std::string>() : json_brief(dt);
    const DtypeInfo* info = nullptr;
    for (const DtypeInfo& d : kSafetensorsDtypes) {
      if (dt.is_string() && dts == d.name) info = &d;
    }
    if (info == nullptr) {
      throw IoError(where + ": dtype " + (dt.is_string() ? quote_name(dts, 16) : json_brief(dt)) +
                    " is not a safetensors dtype");
    }
    if (dts == "F32") {
      t.dtype = DType::F32;
    } else if (dts == "BF16") {
      t.dtype = DType::BF16;
    } else if (dts == "F16") {
      t.dtype = DType::F16;
    } else if (unsupported.empty()) {
      unsupported = where + ": dtype " + dts + " is not supported (F32, BF16 or F16)";
    }
    const json& shape = v.at("shape");
    if (!shape.is_array()) throw IoError(where + ": shape is not a list");
    int64_t n = 1;
    for (const json& d : shape) {
      // Unsigned JSON integers only: -0, 2.0 and 1e3 are not sizes to the reference reader.
      if (!d.is_number_unsigned() || d.get<uint64_t>() > INT64_MAX) {
        throw IoError(where + ": shape " + json_brief(shape) + " is not a list of sizes");
      }
      t.shape.push_back(d.get<int64_t>());
      // A product that wraps would pass the byte count below with too few bytes.
      if (__builtin_mul_overflow(n, d.get<int64_t>(), &n)) {
        throw IoError(where + ": shape " + json_brief(shape) + " has more elements than 2^63");
      }
    }
    t.numel = n;
    uint64_t bits = 0, bytes = 0;
    if (info->bits % 8 == 0 && __builtin_mul_overflow(static_cast<uint64_t>(n), info->bits / 8, &bytes)) {
      throw IoError(where + ": shape " + json_brief(shape) + " needs more than 2^64 bytes");
    }
    if (__builtin_mul_overflow(static_cast<uint64_t>(n), info->bits, &bits)) {
      throw IoError(where + ": shape " + json_brief(shape) +
                    " needs more than 2^64 bits (the safetensors library counts bits)");
    }
    if (bits % 8 != 0) {
      throw IoError(where + ": " + dts + " of shape " + shape_str(t.shape) + " is not a whole number of bytes");
    }
    const uint64_t need = bits / 8;
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
    if (e - b != need) {
      throw IoError(where + ": holds " + std::to_string(e - b) + " bytes, but " + dts + " of shape " +
                    shape_str(t.shape) + " needs " + std::to_string(need));
    }
    t.begin = b;
    t.end = e;
    ranges.push_back({b, e, name});
    h.tensors.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const Range& r : ranges) {
    if (r.begin != at) {
      throw IoError(path + ": tensor " + quote_name(r.name) + " begins at data byte " +
                    std::to_string(r.begin) + ", expected " + std::to_string(at) + " (" +
                    (r.begin < at ? "it overlaps the tensor before it"
                                  : "a gap of " + std::to_string(r.begin - at) + " bytes no tensor covers") +
                    "; the tensors must tile the data exactly)");
    }
    at = r.end;
  }
  if (at != data_size) {
    throw IoError(path + ": the tensors cover " + std::to_string(at) + " of the " +
                  std::to_string(data_size) + " data bytes: " + std::to_string(data_size - at) +
                  " bytes after the last tensor belong to none (a safetensors file is covered exactly)");
  }
  if (!unsupported.empty()) throw IoError(unsupported);
  return h;
}

// Converts e's bytes (src, e.end - e.begin of them) into float32.
void decode_into(const SafeTensorEntry& e, const char* src, float* dst) {
  if (e.numel == 0) return;  // dst may be null (an empty vector's data())
  if (e.dtype == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(e.numel) * 4);
    return;
  }
  convert_to_f32(dst, src, e.dtype, e.numel);  // src need not be 2-byte aligned
}

// The memory the decoded tensors take (float32), checked before any of them is allocated.
void check_decoded_size(const SafeTensorsHeader& h, const std::string& path) {
  double bytes = 0;
  for (const auto& [name, e] : h.tensors) bytes += 4.0 * static_cast<double>(e.numel);
  check_fits_in_memory(bytes, path + ": " + std::to_string(h.tensors.size()) +
                                  " tensors decoded to float32");
}

}  // namespace

SafeTensorsHeader parse_safetensors_header(const std::string& bytes, const std::string& name) {
  check_prefix(bytes.size(), name);
  const uint64_t hl = le64(bytes.data());
  check_header_length(hl, bytes.size(), name);
  return parse_header_json(bytes.data() + 8, hl, bytes.size(), name);
}

SafeTensorsHeader read_safetensors_header(const std::string& path) {
  const InputFile f(path);
  check_prefix(f.size(), path);
  char first[8];
  f.read_at(0, first, 8);
  const uint64_t hl = le64(first);
  check_header_length(hl, f.size(), path);
  const std::string text = f.read_at(8, static_cast<size_t>(hl));
  return parse_header_json(text.data(), hl, f.size(), path);
}

SafeTensorsFile read_safetensors(const std::string& path, const SafeTensorsHeader& h) {
  const InputFile f(path);
  if (f.size() != h.file_size) {
    throw IoError(path + ": changed while being read (" + std::to_string(f.size()) +
                  " bytes, its header was read from " + std::to_string(h.file_size) + ")");
  }
  check_decoded_size(h, path);
  SafeTensorsFile out;
  out.metadata = h.metadata;
  std::vector<char> buf;
  for (const auto& [name, e] : h.tensors) {
    SafeTensor t;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.data.resize(static_cast<size_t>(e.numel));
    const size_t nbytes = static_cast<size_t>(e.end - e.begin);
    if (e.dtype == DType::F32) {
      f.read_at(h.data_offset + e.begin, t.data.data(), nbytes);  // little-endian, as stored
    } else {
      buf.resize(nbytes);
      f.read_at(h.data_offset + e.begin, buf.data(), nbytes);
      decode_into(e, buf.data(), t.data.data());
    }
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

SafeTensorsFile read_safetensors(const std::string& path) {
  return read_safetensors(path, read_safetensors_header(path));
}

SafeTensorsFile parse_safetensors(const std::string& bytes, const std::string& name) {
  const SafeTensorsHeader h = parse_safetensors_header(bytes, name);
  check_decoded_size(h, name);
  SafeTensorsFile out;
  out.metadata = h.metadata;
  for (const auto& [tname, e] : h.tensors) {
    SafeTensor t;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.data.resize(static_cast<size_t>(e.numel));
    decode_into(e, bytes.data() + h.data_offset + e.begin, t.data.data());
    out.tensors.emplace(tname, std::move(t));
  }
  return out;
}

}  // namespace diffattn::model
