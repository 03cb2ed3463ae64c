// Fuzzes the DLPack reader (base/tensor.h): from_dlpack on a DLTensor whose every field comes
// from the input (device, element type, rank, shape, strides, byte offset), then, for a view it
// accepted, to_dlpack and back (the same view; the deleter frees what it made). Any input either
// gives a view or throws a diffattn::Error; nothing is read through the data pointer.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "diffattn/base/tensor.h"

namespace {

template <class T>
T take(const uint8_t*& p, size_t& n) {
  T v{};
  const size_t k = n < sizeof(T) ? n : sizeof(T);
  std::memcpy(&v, p, k);
  p += k;
  n -= k;
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace diffattn;
  const uint8_t* p = data;
  size_t n = size;
  static char buffer[64];
  dlpack::DLTensor t{};
  t.data = buffer;
  t.device.device_type = take<int8_t>(p, n);
  t.device.device_id = take<int8_t>(p, n);
  t.ndim = take<int8_t>(p, n);
  t.dtype.code = take<uint8_t>(p, n);
  t.dtype.bits = take<uint8_t>(p, n);
  t.dtype.lanes = take<uint8_t>(p, n);
  t.byte_offset = take<uint8_t>(p, n) % sizeof(buffer);
  const uint8_t flags = take<uint8_t>(p, n);
  int64_t shape[16] = {}, strides[16] = {};
  for (int i = 0; i < 16; ++i) shape[i] = take<int64_t>(p, n);
  for (int i = 0; i < 16; ++i) strides[i] = take<int64_t>(p, n);
  t.shape = (flags & 1) ? nullptr : shape;
  t.strides = (flags & 2) ? nullptr : strides;
  if (t.ndim > 16) t.ndim = 16;  // the arrays above hold 16 (the reader refuses more than 6)
  try {
    const TensorView v = from_dlpack(t, "fuzz");
    if (v.data != buffer + t.byte_offset) __builtin_trap();
    if (static_cast<int32_t>(v.shape.size()) != t.ndim) __builtin_trap();
    for (int64_t d : v.shape) {
      if (d < 0) __builtin_trap();
    }
    if (!v.shape.empty()) {
      dlpack::DLManagedTensor* m = to_dlpack(v, nullptr);
      const TensorView back = from_dlpack(m->dl_tensor, "round trip");
      if (!(back.shape == v.shape) || back.dtype != v.dtype || back.data != v.data) __builtin_trap();
      m->deleter(m);
    }
  } catch (const diffattn::Error&) {
  }
  return 0;
}
