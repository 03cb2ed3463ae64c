// Python bindings of the operator family. q, k, v are NumPy float32 arrays, read in place through
// their strides (views of a fused QKV buffer or a transposed (B, heads, T, D) tensor: no copy)
// as long as their last dimension is contiguous; anything else is a ValueError that names the
// tensor (a silent conversion would hide a copy or a precision change). The forwards can return
// their saved statistics (out, lse, o2) and the backwards take them back, so a training step
// runs one forward and one backward kernel. The GIL is released while a kernel runs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <string>

#include "bind_common.h"
#include "diffattn/base/memory.h"
#include "diffattn/kernels/attention.h"

namespace py = pybind11;

namespace diffattn::python {

namespace {

kernels::AttnOptions options(bool causal, std::optional<double> scale, const std::string& mode,
                    const char* op) {
  kernels::AttnOptions o;
  o.causal = causal;
  if (scale) {
    if (*scale == 0.0) throw InvalidArgument(std::string(op) + ": scale must be non-zero");
    o.scale = static_cast<float>(*scale);
  }
  o.mode = kernels::parse_diff_mode(mode, std::string(op) + ": mode");
  return o;
}

kernels::Backend backend_of(const std::optional<std::string>& name, const char* op) {
  if (!name) return kernels::Backend::Auto;
  return kernels::parse_backend(*name, std::string(op) + ": backend");
}

kernels::AttnParams diff_params(const char* op, const py::handle& q, const py::handle& k,
                       const py::handle& v, const py::handle& lam, const kernels::AttnOptions& o) {
  kernels::AttnParams p = kernels::diff_attn_params(strided_view_of(op, "q", q), strided_view_of(op, "k", k),
                                  strided_view_of(op, "v", v), view_of(op, "lam", lam), o);
  kernels::check_lambda(p, op);
  return p;
}

kernels::AttnParams std_params(const char* op, const py::handle& q, const py::handle& k,
                      const py::handle& v, const kernels::AttnOptions& o) {
  return kernels::attn_params(strided_view_of(op, "q", q), strided_view_of(op, "k", k),
                     strided_view_of(op, "v", v), o);
}

// The maps a call returns ((B, H, Tq, Tk) float32 each) must fit in memory: checked before the
// forward runs, not after (views of a few bytes can describe terabytes of maps).
void check_maps_fit(const char* op, const kernels::AttnParams& p, int maps) {
  double bytes = 4.0 * maps;
  for (int64_t n : {p.B, p.H, p.Tq, p.Tk}) bytes *= static_cast<double>(n);
  check_fits_in_memory(bytes, std::string(op) + ": " + std::to_string(maps) + " map(s) of shape (B, H, Tq, Tk) = " +
                                  shape_str({p.B, p.H, p.Tq, p.Tk}));
}

// Forward with saved statistics; returns (out, lse, o2) where o2 is None for standard attention.
struct Forward {
  kernels::AttnParams p;
  py::array_t<float> out, lse, o2;
};

Forward forward(kernels::AttnParams p, kernels::Backend backend) {
  Forward f;
  f.out = new_array(p.out_shape());
  f.lse = new_array(p.lse_shape());
  p.out = f.out.mutable_data();
  p.lse = f.lse.mutable_data();
  if (p.maps == 2) {
    f.o2 = new_array(p.out_shape());
    p.o2 = f.o2.mutable_data();
  }
  {
    py::gil_scoped_release nogil;
    kernels::attention_fwd(p, backend);
  }
  f.p = p;
  return f;
}

// The statistics a forward saved, as the caller hands them back: each must have the shape the
// forward gave it (out and o2 (B, Tq, H, Dv), lse (B, maps*H, Tq)), contiguous. The backward
// only reads them (AttnBwdParams holds them as const); the caller's arrays outlive the call.
kernels::AttnBwdParams saved(const kernels::AttnParams& p, const py::handle& out, const py::handle& lse,
                    const py::handle& o2, const char* op) {
  kernels::AttnBwdParams bp(p);
  const TensorView vo = view_of(op, "out", out), vl = view_of(op, "lse", lse);
  check_shape(op, "out", vo.shape, p.out_shape(), "(B, Tq, H, Dv)");
  check_shape(op, "lse", vl.shape, p.lse_shape(), "(B, maps*H, Tq)");
  bp.out = vo.f32();
  bp.lse = vl.f32();
  if (p.maps == 2) {
    const TensorView v2 = view_of(op, "o2", o2);
    check_shape(op, "o2", v2.shape, p.out_shape(), "(B, Tq, H, Dv)");
    bp.o2 = v2.f32();
  }
  return bp;
}

// Whether the caller handed back saved statistics: all of them or none.
bool has_saved(const py::object& out, const py::object& lse, const py::object& o2, bool diff,
               const char* op) {
  const int given = !out.is_none() + !lse.is_none() + (diff ? !o2.is_none() : 0);
  const int all = diff ? 3 : 2;
  if (given != 0 && given != all) {
    throw InvalidArgument(std::string(op) + ": pass all of the forward's saved statistics (" +
                          (diff ? "out, lse, o2" : "out, lse") + ") or none of them");
  }
  return given == all;
}

// bp: the forward's problem and saved statistics (from forward() or saved()).
py::tuple backward(kernels::AttnBwdParams bp, const py::handle& dout_obj, kernels::Backend backend,
                   const char* op) {
  // dout is read with out's layout (contiguous): a strided float32 dout is copied once; any
  // other dtype or type is left to view_of, which names it.
  py::object dout_obj2 = py::reinterpret_borrow<py::object>(dout_obj);
  if (py::isinstance<py::array>(dout_obj)) {
    const auto a = py::reinterpret_borrow<py::array>(dout_obj);
    if (a.dtype().is(py::dtype::of<float>()) && !(a.flags() & py::array::c_style)) {
      dout_obj2 = py::array_t<float, py::array::c_style>::ensure(dout_obj);
    }
  }
  const TensorView dout = view_of(op, "dout", dout_obj2);
  check_shape(op, "dout", dout.shape, bp.out_shape(), "(B, Tq, H, Dv)");
  bp.dout = dout.f32();
  // Each gradient takes its input's layout (the kernels write dq with q's strides).
  const kernels::AttnProblem& p = bp;
  py::array_t<float> dq = new_strided_array(p.q_shape(), {p.q_batch_stride, p.q_row_stride,
                                                          p.q_head_stride, 1});
  py::array_t<float> dk = new_strided_array(p.k_shape(), {p.k_batch_stride, p.k_row_stride,
                                                          p.k_head_stride, 1});
  py::array_t<float> dv = new_strided_array(p.v_shape(), {p.v_batch_stride, p.v_row_stride,
                                                          p.v_head_stride, 1});
  bp.dq = dq.mutable_data();
  bp.dk = dk.mutable_data();
  bp.dv = dv.mutable_data();
  py::array_t<float> dlam;
  if (p.maps == 2) {
    dlam = new_array(p.lam_shape());
    bp.dlam = dlam.mutable_data();
  }
  {
    py::gil_scoped_release nogil;
    kernels::attention_bwd(bp, backend);
  }
  if (p.maps == 2) return py::make_tuple(dq, dk, dv, dlam);
  return py::make_tuple(dq, dk, dv);
}

py::array_t<float> maps_of(const Forward& f, int map) {
  py::array_t<float> probs = new_array({f.p.B, f.p.H, f.p.Tq, f.p.Tk});
  float* dst = probs.mutable_data();
  py::gil_scoped_release nogil;
  kernels::attention_probs(f.p, map, dst);
  return probs;
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def(
      "diff_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& lam,
         bool causal, std::optional<double> scale, const std::string& mode,
         std::optional<std::string> backend, bool return_stats) -> py::object {
        const char* op = "diff_attention";
        const kernels::AttnParams p = diff_params(op, q, k, v, lam, options(causal, scale, mode, op));
        const Forward f = forward(p, backend_of(backend, op));
        if (return_stats) return py::make_tuple(f.out, f.lse, f.o2);
        return f.out;
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("lam"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("mode") = "signed", py::arg("backend") = py::none(),
      py::arg("return_stats") = false,
      R"doc(Differential attention (arXiv:2410.05258, Eq. 1).

q (B, Tq, 2H, D): pair h uses sub-head 2h (map 1) and 2h+1 (map 2).
k (B, Tk, 2G, D) separate keys per map (V1), or (B, Tk, G, D) shared keys (V2).
v (B, Tk, G, Dv).  lam (H) per pair, (1) for every pair, or (B, Tq, H) per token and pair.
Returns out (B, Tq, H, Dv) = softmax(s q1 k1^T) v - lam softmax(s q2 k2^T) v,
s = scale or 1/sqrt(D). Pair h reads key/value group h // (H // G).
causal: query i sees key j iff j <= i + Tk - Tq. mode "clamp": the textbook's
max(A1 - lam A2, 0) renormalised per row. backend: "auto", "fused" or "reference".
return_stats: return (out, lse, o2), the statistics diff_attention_backward takes
back: lse (B, 2H, Tq) the log-sum-exp of each map's scaled scores, o2 (B, Tq, H, Dv)
map 2's output A2 v.
Arrays: NumPy float32. q, k, v may be strided views (any non-negative strides with a
contiguous last dimension, e.g. a (B, heads, T, D) array transposed to (B, T, heads, D)):
they are read in place. lam is contiguous.)doc");

  m.def(
      "diff_attention_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& lam,
         const py::handle& dout, bool causal, std::optional<double> scale,
         std::optional<std::string> backend, const py::object& out, const py::object& lse,
         const py::object& o2) {
        const char* op = "diff_attention_backward";
        const kernels::AttnParams p = diff_params(op, q, k, v, lam, options(causal, scale, "signed", op));
        const kernels::Backend b = backend_of(backend, op);
        if (has_saved(out, lse, o2, true, op)) return backward(saved(p, out, lse, o2, op), dout, b, op);
        const Forward f = forward(p, b);  // its arrays outlive the backward
        return backward(kernels::AttnBwdParams(f.p), dout, b, op);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("lam"), py::arg("dout"),
      py::arg("causal") = false, py::arg("scale") = py::none(), py::arg("backend") = py::none(),
      py::arg("out") = py::none(), py::arg("lse") = py::none(), py::arg("o2") = py::none(),
      R"doc(Gradients of signed differential attention: returns (dq, dk, dv, dlam), each with
the shape of its input (dq, dk, dv also with its input's strides); dout has out's shape
(B, Tq, H, Dv). Given the forward's saved statistics (out, lse, o2 from
diff_attention(..., return_stats=True)) it runs no forward; without them it runs one.)doc");

  m.def(
      "attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, bool causal,
         std::optional<double> scale, std::optional<std::string> backend,
         bool return_stats) -> py::object {
        const char* op = "attention";
        const kernels::AttnParams p = std_params(op, q, k, v, options(causal, scale, "signed", op));
        const Forward f = forward(p, backend_of(backend, op));
        if (return_stats) return py::make_tuple(f.out, f.lse);
        return f.out;
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("backend") = py::none(),
      py::arg("return_stats") = false,
      R"doc(Standard softmax attention: q (B, Tq, H, D), k (B, Tk, G, D), v (B, Tk, G, Dv)
-> out (B, Tq, H, Dv). Head h reads group h // (H // G). return_stats: return
(out, lse), lse (B, H, Tq). Strided q, k, v as for diff_attention.)doc");

  m.def(
      "attention_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& dout,
         bool causal, std::optional<double> scale, std::optional<std::string> backend,
         const py::object& out, const py::object& lse) {
        const char* op = "attention_backward";
        const kernels::AttnParams p = std_params(op, q, k, v, options(causal, scale, "signed", op));
        const kernels::Backend b = backend_of(backend, op);
        if (has_saved(out, lse, py::none(), false, op)) {
          return backward(saved(p, out, lse, py::none(), op), dout, b, op);
        }
        const Forward f = forward(p, b);  // its arrays outlive the backward
        return backward(kernels::AttnBwdParams(f.p), dout, b, op);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dout"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("backend") = py::none(),
      py::arg("out") = py::none(), py::arg("lse") = py::none(),
      R"doc(Gradients of standard attention: returns (dq, dk, dv). Given the forward's saved
(out, lse) from attention(..., return_stats=True) it runs no forward.)doc");

  m.def(
      "diff_attention_maps",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& lam,
         bool causal, std::optional<double> scale) {
        const char* op = "diff_attention_maps";
        const kernels::AttnParams p = diff_params(op, q, k, v, lam, options(causal, scale, "signed", op));
        check_maps_fit(op, p, 2);
        const Forward f = forward(p, kernels::Backend::Auto);
        return py::make_tuple(maps_of(f, 0), maps_of(f, 1));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("lam"), py::arg("causal") = false,
      py::arg("scale") = py::none(),
      R"doc(The two softmax maps (A1, A2) of differential attention, each (B, H, Tq, Tk),
recomputed from the forward's saved log-sum-exp.)doc");

  m.def(
      "attention_map",
      [](const py::handle& q, const py::handle& k, const py::handle& v, bool causal,
         std::optional<double> scale) {
        const char* op = "attention_map";
        const kernels::AttnParams p = std_params(op, q, k, v, options(causal, scale, "signed", op));
        check_maps_fit(op, p, 1);
        return maps_of(forward(p, kernels::Backend::Auto), 0);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false,
      py::arg("scale") = py::none(),
      R"doc(The softmax map of standard attention, (B, H, Tq, Tk).)doc");

  m.def(
      "kernel_calls",
      [] {
        const kernels::KernelCalls c = kernels::kernel_calls();
        py::dict d;
        d["forward"] = c.forward;
        d["backward"] = c.backward;
        d["decode"] = c.decode;
        return d;
      },
      R"doc(How many forward, backward and decode kernel calls this process has run, as a dict:
shows, for example, that a backward given the saved statistics runs no forward.)doc");
}

}  // namespace diffattn::python
