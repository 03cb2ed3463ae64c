// The one tensor view every layer passes around (docs/DESIGN.md, "base"): data, element type,
// shape, element strides and device, read only. A weight of a model (Model::weight), an
// operator's input (kernels::diff_attn_params) and a bare typed pointer handed to a kernel that
// is told its sizes (nn::linear_fwd's weight) are all TensorViews. A view owns nothing: whoever
// made it keeps the memory alive. to_dlpack exports one to any DLPack consumer (PyTorch, NumPy,
// JAX, CuPy) without a copy; from_dlpack reads one back.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>

#include "diffattn/base/dtype.h"
#include "diffattn/base/error.h"

namespace diffattn {

// A shape or a stride list held inline (no allocation: views are copied on hot paths), at most
// kMax dimensions, outermost first. Converts to and from Shape.
class Dims {
 public:
  static constexpr int kMax = 6;
  Dims() = default;
  Dims(std::initializer_list<int64_t> v);  // throws InvalidArgument above kMax dimensions
  Dims(const Shape& v);                    // NOLINT: a Shape is a Dims
  size_t size() const { return static_cast<size_t>(n_); }
  bool empty() const { return n_ == 0; }
  int64_t operator[](size_t i) const { return v_[i]; }
  int64_t& operator[](size_t i) { return v_[i]; }
  const int64_t* begin() const { return v_; }
  const int64_t* end() const { return v_ + n_; }
  const int64_t* data() const { return v_; }
  Shape vec() const { return Shape(begin(), end()); }
  operator Shape() const { return vec(); }  // NOLINT
  bool operator==(const Dims& o) const;

 private:
  int64_t v_[kMax] = {};
  int32_t n_ = 0;
};

// Where a view's data lives; the codes are DLPack's (kDLCPU = 1, kDLCUDA = 2).
enum class DeviceType : int32_t { CPU = 1, CUDA = 2 };
struct Device {
  DeviceType type = DeviceType::CPU;
  int32_t id = 0;
  bool operator==(const Device&) const = default;
};
const char* device_name(DeviceType t);  // "cpu", "cuda"

// A read-only view of a tensor. An empty shape means "not told" (a typed pointer whose sizes
// the callee is given separately); empty strides mean row-major contiguous. Strides are in
// elements, as PyTorch's and NumPy's (in bytes) divided by the element size.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  Dims shape{};
  Dims strides{};  // empty: contiguous
  Device device{};

  TensorView() = default;
  // A float32 host view of data with this shape (and strides).
  TensorView(const float* p, const Dims& shape_, const Dims& strides_ = {})
      : data(p), dtype(DType::F32), shape(shape_), strides(strides_) {}
  // A view of data in type t; without a shape, a typed pointer whose sizes the callee is told.
  TensorView(const void* p, DType t, const Dims& shape_ = {}, const Dims& strides_ = {},
             Device device_ = {})
      : data(p), dtype(t), shape(shape_), strides(strides_), device(device_) {}

  // The strides in force: `strides`, or the contiguous ones of `shape`.
  Dims effective_strides() const;
  int64_t numel() const;  // product of shape (1 for an empty one)
  bool contiguous() const;
  // data as float32 on the host; throws InvalidArgument (naming the type or the device)
  // otherwise.
  const float* f32() const;
  // data as 16-bit words on the host (BF16 or F16); throws InvalidArgument otherwise.
  const uint16_t* u16() const;
};
// A float32 host pointer as a view without a shape (the callee is told the sizes).
inline TensorView typed(const float* p) { return TensorView(p, DType::F32); }
// Row-major contiguous strides of a shape.
Dims contiguous_strides(const Dims& shape);

// ---- DLPack (the array-exchange ABI of dmlc/dlpack, version 1.0), declared here so that the
// library needs no third-party header; the layouts are the ABI's. ----
namespace dlpack {
struct DLDevice {
  int32_t device_type;  // 1 CPU, 2 CUDA
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // elements; may be null (contiguous)
  uint64_t byte_offset;
};
// The unversioned ("dltensor" capsule) and the 1.0 versioned ("dltensor_versioned") handles.
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;  // kFlagReadOnly, ...
  DLTensor dl_tensor;
};
inline constexpr uint64_t kFlagReadOnly = 1;
inline constexpr int32_t kCodeFloat = 2, kCodeBfloat = 4;
}  // namespace dlpack

// A DLPack handle for v (its shape must be given), keeping `owner` alive until the consumer
// calls its deleter. The unversioned handle cannot say read only: a consumer that writes
// through it writes the viewed memory (a memory-mapped weight file is mapped read only, and a
// write there faults). The versioned handle carries kFlagReadOnly.
dlpack::DLManagedTensor* to_dlpack(const TensorView& v, std::shared_ptr<const void> owner);
dlpack::DLManagedTensorVersioned* to_dlpack_versioned(const TensorView& v,
                                                      std::shared_ptr<const void> owner);
// A view of a DLPack tensor (F32, BF16 or F16, on the CPU or CUDA, at most Dims::kMax
// dimensions, byte_offset applied); anything else is an InvalidArgument naming `what` and the
// reason. The handle keeps ownership: the view is valid while the caller holds it.
TensorView from_dlpack(const dlpack::DLTensor& t, const char* what);

}  // namespace diffattn
