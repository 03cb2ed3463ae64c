// safetensors files: reading (checked header, ranges, overlaps, memory) and writing (atomic),
// F32, BF16 and F16 (include/diffattn/base/dtype.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "diffattn/base/dtype.h"
#include "diffattn/base/error.h"

namespace diffattn::model {

struct SafeTensor {
  DType dtype = DType::F32;
  Shape shape;
  std::vector<float> data;  // converted to float32
};

struct SafeTensorsFile {
  std::map<std::string, SafeTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Writes float32 tensors (name, shape, data) and metadata, atomically, stored as dtype (BF16 and
// F16 rounded to nearest even).
struct SafeTensorRef {
  std::string name;
  Shape shape;
  const float* data = nullptr;
};
void write_safetensors(const std::string& path, const std::vector<SafeTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       DType dtype = DType::F32);
// The header alone: every tensor's dtype, shape and byte range in the data (checked: sizes
// without overflow, ranges inside the data, no overlaps), and the metadata.
struct SafeTensorEntry {
  DType dtype = DType::F32;
  Shape shape;
  int64_t numel = 0;
  uint64_t begin = 0, end = 0;  // byte range in the data that follows the header
};
struct SafeTensorsHeader {
  std::map<std::string, SafeTensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + header length: where the data starts in the file
  uint64_t file_size = 0;
};
// The longest JSON header accepted (the reference implementation's limit too).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
// Reads and checks only the first 8 + header-length bytes of path.
SafeTensorsHeader read_safetensors_header(const std::string& path);
// The same checks on bytes in memory (name: what messages call it).
SafeTensorsHeader parse_safetensors_header(const std::string& bytes, const std::string& name);
// Reads and checks a whole file: header length, JSON, dtype, shapes, offsets within the data,
// overlaps; the decoded tensors are checked against the machine's memory before allocation.
// Errors (IoError) name the file and the tensor.
SafeTensorsFile read_safetensors(const std::string& path);
// The data of a header already read by read_safetensors_header(path) (the file must still have
// the size it had).
SafeTensorsFile read_safetensors(const std::string& path, const SafeTensorsHeader& header);
// A whole safetensors file in memory (name: what messages call it).
SafeTensorsFile parse_safetensors(const std::string& bytes, const std::string& name);

}  // namespace diffattn::model
