// The operators on tensors handed over by address: each tensor is a tuple (data address, shape,
// strides in elements) of float32 host memory. This is how diffattn.torch's custom ops reach the
// kernels without a NumPy round trip: the caller (python/diffattn/torch/ops.py) takes the
// address, shape and strides from a torch tensor it validated and allocates every output itself,
// with the layout the kernels write (out, lse, o2 contiguous; each gradient with its input's
// strides). The shapes and strides are checked here as for the NumPy operators; the addresses
// are trusted (these functions are private: a wrong address is outside what a check can see).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "bind_common.h"
#include "diffattn/kernels/attention.h"

namespace py = pybind11;

namespace diffattn::python {

namespace {

// (address, shape, strides) as a view; a malformed tuple is an error naming the tensor.
TensorView raw_view(const char* op, const char* name, const py::handle& obj) {
  if (!py::isinstance<py::tuple>(obj) || py::len(obj) != 3) {
    throw InvalidArgument(std::string(op) + ": " + name +
                          " must be a tuple (address, shape, strides)");
  }
  const auto t = py::reinterpret_borrow<py::tuple>(obj);
  const auto addr = t[0].cast<uintptr_t>();
  TensorView v = TensorView(reinterpret_cast<const float*>(addr), t[1].cast<Shape>(), t[2].cast<Shape>());
  if (v.shape.size() != v.strides.size()) {
    throw InvalidArgument(std::string(op) + ": " + name + " has " +
                          std::to_string(v.shape.size()) + " sizes and " +
                          std::to_string(v.strides.size()) + " strides");
  }
  // A dimension of size 1 has no stride that matters; torch keeps any there (x[:, a:b] of a
  // batch of one keeps the parent's), so it takes the contiguous one.
  int64_t inner = 1;
  for (size_t i = v.shape.size(); i-- > 0;) {
    if (v.shape[i] == 1) v.strides[i] = inner;
    inner *= std::max<int64_t>(v.shape[i], 1);
  }
  if (addr % alignof(float) != 0) {
    throw InvalidArgument(std::string(op) + ": " + name + " is not aligned to 4 bytes");
  }
  return v;
}

// An output the caller allocated: its shape must be `want` and its strides `strides` (the
// layout the kernel writes).
float* raw_output(const char* op, const char* name, const py::handle& obj, const Shape& want,
                  const Shape& strides) {
  const TensorView v = raw_view(op, name, obj);
  check_shape(op, name, v.shape, want, "the forward's shape");
  bool same = true;  // a dimension of size 1 has no stride that matters (torch keeps any)
  for (size_t i = 0; i < want.size(); ++i) same = same && (want[i] <= 1 || v.strides[i] == strides[i]);
  if (!same) {
    throw InvalidArgument(std::string(op) + ": " + name + " has strides " +
                          shape_str(v.strides) + ", the kernel writes " + shape_str(strides));
  }
  return const_cast<float*>(v.f32());
}

kernels::AttnParams problem(const char* op, const py::handle& q, const py::handle& k, const py::handle& v,
                   const py::object& lam, bool causal, std::optional<double> scale) {
  kernels::AttnOptions o;
  o.causal = causal;
  if (scale) {
    if (*scale == 0.0) throw InvalidArgument(std::string(op) + ": scale must be non-zero");
    o.scale = static_cast<float>(*scale);
  }
  if (lam.is_none()) {
    return kernels::attn_params(raw_view(op, "q", q), raw_view(op, "k", k), raw_view(op, "v", v), o);
  }
  kernels::AttnParams p = kernels::diff_attn_params(raw_view(op, "q", q), raw_view(op, "k", k),
                                  raw_view(op, "v", v), raw_view(op, "lam", lam), o);
  kernels::check_lambda(p, op);
  return p;
}

kernels::Backend backend_named(const std::string& name, const char* op) {
  return kernels::parse_backend(name, std::string(op) + ": backend");
}

}  // namespace

void bind_tensors(py::module_& m) {
  m.def(
      "_attention_fwd_raw",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::object& lam,
         const py::handle& out, const py::handle& lse, const py::object& o2, bool causal,
         std::optional<double> scale, const std::string& backend) {
        const char* op = "attention forward";
        kernels::AttnParams p = problem(op, q, k, v, lam, causal, scale);
        p.out = raw_output(op, "out", out, p.out_shape(), contiguous_strides(p.out_shape()));
        p.lse = raw_output(op, "lse", lse, p.lse_shape(), contiguous_strides(p.lse_shape()));
        if (p.maps == 2) {
          p.o2 = raw_output(op, "o2", o2, p.out_shape(), contiguous_strides(p.out_shape()));
        }
        const kernels::Backend b = backend_named(backend, op);
        py::gil_scoped_release nogil;
        kernels::attention_fwd(p, b);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("lam"), py::arg("out"), py::arg("lse"),
      py::arg("o2"), py::arg("causal"), py::arg("scale"), py::arg("backend"),
      "Private: the forward on (address, shape, strides) tensors; lam None is standard "
      "attention. Writes out, lse (and o2), which the caller allocated contiguous.");

  m.def(
      "_attention_bwd_raw",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::object& lam,
         const py::handle& out, const py::handle& lse, const py::object& o2,
         const py::handle& dout, const py::handle& dq, const py::handle& dk,
         const py::handle& dv, const py::object& dlam, bool causal, std::optional<double> scale,
         const std::string& backend) {
        const char* op = "attention backward";
        const kernels::AttnParams p = problem(op, q, k, v, lam, causal, scale);
        kernels::AttnBwdParams bp(p);
        const Shape os = p.out_shape(), oc = contiguous_strides(os);
        bp.out = raw_output(op, "out", out, os, oc);
        bp.lse = raw_output(op, "lse", lse, p.lse_shape(), contiguous_strides(p.lse_shape()));
        if (p.maps == 2) bp.o2 = raw_output(op, "o2", o2, os, oc);
        bp.dout = raw_output(op, "dout", dout, os, oc);
        bp.dq = raw_output(op, "dq", dq, p.q_shape(),
                           {p.q_batch_stride, p.q_row_stride, p.q_head_stride, 1});
        bp.dk = raw_output(op, "dk", dk, p.k_shape(),
                           {p.k_batch_stride, p.k_row_stride, p.k_head_stride, 1});
        bp.dv = raw_output(op, "dv", dv, p.v_shape(),
                           {p.v_batch_stride, p.v_row_stride, p.v_head_stride, 1});
        if (p.maps == 2) {
          bp.dlam = raw_output(op, "dlam", dlam, p.lam_shape(), contiguous_strides(p.lam_shape()));
        }
        const kernels::Backend b = backend_named(backend, op);
        py::gil_scoped_release nogil;
        kernels::attention_bwd(bp, b);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("lam"), py::arg("out"), py::arg("lse"),
      py::arg("o2"), py::arg("dout"), py::arg("dq"), py::arg("dk"), py::arg("dv"),
      py::arg("dlam"), py::arg("causal"), py::arg("scale"), py::arg("backend"),
      "Private: the backward on (address, shape, strides) tensors, given the forward's saved "
      "out, lse (and o2); writes dq, dk, dv with their inputs' strides (and dlam).");
}

}  // namespace diffattn::python
