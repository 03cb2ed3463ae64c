// The tensor view and its DLPack export (include/diffattn/base/tensor.h).
#include "diffattn/base/tensor.h"

#include <string>

namespace diffattn {

namespace {

void check_rank(size_t n) {
  if (n > static_cast<size_t>(Dims::kMax)) {
    throw InvalidArgument("tensor view: " + std::to_string(n) + " dimensions, at most " +
                          std::to_string(Dims::kMax) + " are supported");
  }
}

dlpack::DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::F32: return {dlpack::kCodeFloat, 32, 1};
    case DType::BF16: return {dlpack::kCodeBfloat, 16, 1};
    case DType::F16: return {dlpack::kCodeFloat, 16, 1};
  }
  throw InvalidArgument("to_dlpack: unknown dtype " + std::to_string(static_cast<int>(t)));
}

// What a handle's manager_ctx points to: the shape and strides arrays the DLTensor points into,
// and the owner of the data.
struct Holder {
  int64_t shape[Dims::kMax] = {};
  int64_t strides[Dims::kMax] = {};
  std::shared_ptr<const void> owner;
};

template <class Managed>
Managed* make_handle(const TensorView& v, std::shared_ptr<const void> owner, const char* op) {
  if (v.shape.empty()) throw InvalidArgument(std::string(op) + ": the view has no shape");
  if (v.data == nullptr) throw InvalidArgument(std::string(op) + ": the view has no data");
  auto holder = std::make_unique<Holder>();
  const Dims st = v.effective_strides();
  for (size_t i = 0; i < v.shape.size(); ++i) {
    holder->shape[i] = v.shape[i];
    holder->strides[i] = st[i];
  }
  holder->owner = std::move(owner);
  auto m = std::make_unique<Managed>();
  dlpack::DLTensor& t = m->dl_tensor;
  t.data = const_cast<void*>(v.data);  // NOLINT: read only by contract (tensor.h)
  t.device = {static_cast<int32_t>(v.device.type), v.device.id};
  t.ndim = static_cast<int32_t>(v.shape.size());
  t.dtype = dl_dtype(v.dtype);
  t.shape = holder->shape;
  t.strides = holder->strides;
  t.byte_offset = 0;
  m->manager_ctx = holder.release();
  m->deleter = [](Managed* self) {
    if (self == nullptr) return;
    delete static_cast<Holder*>(self->manager_ctx);
    delete self;
  };
  return m.release();
}

}  // namespace

Dims::Dims(std::initializer_list<int64_t> v) {
  check_rank(v.size());
  for (int64_t x : v) v_[n_++] = x;
}

Dims::Dims(const Shape& v) {
  check_rank(v.size());
  for (int64_t x : v) v_[n_++] = x;
}

bool Dims::operator==(const Dims& o) const {
  if (n_ != o.n_) return false;
  for (int32_t i = 0; i < n_; ++i) {
    if (v_[i] != o.v_[i]) return false;
  }
  return true;
}

const char* device_name(DeviceType t) {
  switch (t) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda";
  }
  return "unknown";
}

Dims contiguous_strides(const Dims& shape) {
  Dims s = shape;
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    // a zero-size dimension leaves the others' strides
    if (__builtin_mul_overflow(acc, shape[i] > 1 ? shape[i] : 1, &acc)) {
      throw InvalidArgument("tensor view: shape " + shape_str(shape.vec()) + " has more elements than int64 counts");
    }
  }
  return s;
}

Dims TensorView::effective_strides() const {
  return strides.empty() ? contiguous_strides(shape) : strides;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t x : shape) {
    if (__builtin_mul_overflow(n, x, &n)) {
      throw InvalidArgument("tensor view: shape " + shape_str(shape.vec()) + " has more elements than int64 counts");
    }
  }
  return n;
}

bool TensorView::contiguous() const { return strides.empty() || strides == contiguous_strides(shape); }

const float* TensorView::f32() const {
  if (dtype != DType::F32) {
    throw InvalidArgument(std::string("tensor view: the tensor is ") + dtype_name(dtype) +
                          ", not F32");
  }
  if (device.type != DeviceType::CPU) {
    throw InvalidArgument(std::string("tensor view: the tensor is on ") + device_name(device.type) +
                          ", not the CPU");
  }
  return static_cast<const float*>(data);
}

const uint16_t* TensorView::u16() const {
  if (dtype != DType::BF16 && dtype != DType::F16) {
    throw InvalidArgument(std::string("tensor view: the tensor is ") + dtype_name(dtype) +
                          ", not BF16 or F16");
  }
  if (device.type != DeviceType::CPU) {
    throw InvalidArgument(std::string("tensor view: the tensor is on ") + device_name(device.type) +
                          ", not the CPU");
  }
  return static_cast<const uint16_t*>(data);
}

dlpack::DLManagedTensor* to_dlpack(const TensorView& v, std::shared_ptr<const void> owner) {
  return make_handle<dlpack::DLManagedTensor>(v, std::move(owner), "to_dlpack");
}

dlpack::DLManagedTensorVersioned* to_dlpack_versioned(const TensorView& v,
                                                      std::shared_ptr<const void> owner) {
  auto* m = make_handle<dlpack::DLManagedTensorVersioned>(v, std::move(owner), "to_dlpack");
  m->version = {1, 0};
  m->flags = dlpack::kFlagReadOnly;
  return m;
}

TensorView from_dlpack(const dlpack::DLTensor& t, const char* what) {
  const std::string w(what);
  TensorView v;
  if (t.device.device_type == static_cast<int32_t>(DeviceType::CPU)) {
    v.device = {DeviceType::CPU, t.device.device_id};
  } else if (t.device.device_type == static_cast<int32_t>(DeviceType::CUDA)) {
    v.device = {DeviceType::CUDA, t.device.device_id};
  } else {
    throw InvalidArgument(w + ": DLPack device type " + std::to_string(t.device.device_type) +
                          " is not supported (CPU or CUDA)");
  }
  if (t.dtype.lanes != 1) throw InvalidArgument(w + ": vector element types are not supported");
  if (t.dtype.code == dlpack::kCodeFloat && t.dtype.bits == 32) {
    v.dtype = DType::F32;
  } else if (t.dtype.code == dlpack::kCodeFloat && t.dtype.bits == 16) {
    v.dtype = DType::F16;
  } else if (t.dtype.code == dlpack::kCodeBfloat && t.dtype.bits == 16) {
    v.dtype = DType::BF16;
  } else {
    throw InvalidArgument(w + ": DLPack element type (code " + std::to_string(t.dtype.code) +
                          ", " + std::to_string(t.dtype.bits) +
                          " bits) is not supported (float32, bfloat16, float16)");
  }
  if (t.ndim < 0 || t.ndim > Dims::kMax) {
    throw InvalidArgument(w + ": " + std::to_string(t.ndim) + " dimensions (at most " +
                          std::to_string(Dims::kMax) + ")");
  }
  if (t.ndim > 0 && t.shape == nullptr) throw InvalidArgument(w + ": DLPack tensor without a shape");
  Shape shape(t.shape, t.shape + t.ndim);
  for (int64_t x : shape) {
    if (x < 0) throw InvalidArgument(w + ": negative size in shape " + shape_str(shape));
  }
  v.shape = shape;
  (void)contiguous_strides(v.shape);  // throws for a shape whose element count overflows
  if (t.strides != nullptr) v.strides = Shape(t.strides, t.strides + t.ndim);
  v.data = static_cast<const char*>(t.data) + t.byte_offset;
  return v;
}

}  // namespace diffattn
