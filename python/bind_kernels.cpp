// Python bindings of the operator family. Arrays must be NumPy float32 and C-contiguous: a
// silent conversion would hide a copy or a precision change, so anything else is a ValueError
// that names the tensor. The GIL is released while a kernel runs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "bind_common.h"
#include "diffattn/attention.h"

namespace py = pybind11;

namespace diffattn::python {

namespace {

AttnOptions options(bool causal, std::optional<double> scale, const std::string& mode,
                    const char* op) {
  AttnOptions o;
  o.causal = causal;
  if (scale) {
    if (*scale == 0.0) throw InvalidArgument(std::string(op) + ": scale must be non-zero");
    o.scale = static_cast<float>(*scale);
  }
  if (mode == "signed") {
    o.mode = DiffMode::Signed;
  } else if (mode == "clamp") {
    o.mode = DiffMode::Clamp;
  } else {
    throw InvalidArgument(std::string(op) + ": mode must be \"signed\" or \"clamp\", got \"" +
                          mode + "\"");
  }
  return o;
}

Backend backend_of(const std::optional<std::string>& name, const char* op) {
  if (!name || *name == "auto") return Backend::Auto;
  if (*name == "reference") return Backend::Reference;
  if (*name == "fused") return Backend::Fused;
  throw InvalidArgument(std::string(op) + ": backend must be \"auto\", \"fused\" or "
                        "\"reference\", got \"" + *name + "\"");
}

// Forward with saved statistics; returns (out, lse, o2) where o2 is None for standard attention.
struct Forward {
  AttnParams p;
  py::array_t<float> out, lse, o2;
};

Forward forward(AttnParams p, Backend backend) {
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
    attention_fwd(p, backend);
  }
  f.p = p;
  return f;
}

py::tuple backward(const Forward& f, const py::handle& dout_obj, Backend backend,
                   const char* op) {
  const ConstView dout = view_of(op, "dout", dout_obj);
  check_shape(op, "dout", dout.shape, f.p.out_shape(), "(B, Tq, H, Dv)");
  AttnBwdParams bp(f.p);
  bp.dout = dout.data;
  py::array_t<float> dq = new_array(f.p.q_shape()), dk = new_array(f.p.k_shape()),
                     dv = new_array(f.p.v_shape());
  bp.dq = dq.mutable_data();
  bp.dk = dk.mutable_data();
  bp.dv = dv.mutable_data();
  py::array_t<float> dlam;
  if (f.p.maps == 2) {
    dlam = new_array(f.p.lam_shape());
    bp.dlam = dlam.mutable_data();
  }
  {
    py::gil_scoped_release nogil;
    attention_bwd(bp, backend);
  }
  if (f.p.maps == 2) return py::make_tuple(dq, dk, dv, dlam);
  return py::make_tuple(dq, dk, dv);
}

py::array_t<float> maps_of(const Forward& f, int map) {
  py::array_t<float> probs = new_array({f.p.B, f.p.H, f.p.Tq, f.p.Tk});
  float* dst = probs.mutable_data();
  py::gil_scoped_release nogil;
  attention_probs(f.p, map, dst);
  return probs;
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def(
      "diff_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& lam,
         bool causal, std::optional<double> scale, const std::string& mode,
         std::optional<std::string> backend) {
        const char* op = "diff_attention";
        const AttnParams p =
            diff_attn_params(view_of(op, "q", q), view_of(op, "k", k), view_of(op, "v", v),
                             view_of(op, "lam", lam), options(causal, scale, mode, op));
        return forward(p, backend_of(backend, op)).out;
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("lam"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("mode") = "signed", py::arg("backend") = py::none(),
      R"doc(Differential attention (arXiv:2410.05258, Eq. 1).

q (B, Tq, 2H, D): pair h uses sub-head 2h (map 1) and 2h+1 (map 2).
k (B, Tk, 2G, D) separate keys per map (V1), or (B, Tk, G, D) shared keys (V2).
v (B, Tk, G, Dv).  lam (H) per pair, or (B, Tq, H) per token and pair.
Returns out (B, Tq, H, Dv) = softmax(s q1 k1^T) v - lam softmax(s q2 k2^T) v,
s = scale or 1/sqrt(D). Pair h reads key/value group h // (H // G).
causal: query i sees key j iff j <= i + Tk - Tq. mode "clamp": the textbook's
max(A1 - lam A2, 0) renormalised per row. backend: "auto", "fused" or "reference".
All arrays: NumPy float32, C-contiguous.)doc");

  m.def(
      "diff_attention_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& lam,
         const py::handle& dout, bool causal, std::optional<double> scale,
         std::optional<std::string> backend) {
        const char* op = "diff_attention_backward";
        const AttnParams p =
            diff_attn_params(view_of(op, "q", q), view_of(op, "k", k), view_of(op, "v", v),
                             view_of(op, "lam", lam), options(causal, scale, "signed", op));
        const Backend b = backend_of(backend, op);
        return backward(forward(p, b), dout, b, op);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("lam"), py::arg("dout"),
      py::arg("causal") = false, py::arg("scale") = py::none(), py::arg("backend") = py::none(),
      R"doc(Gradients of signed differential attention: returns (dq, dk, dv, dlam), each with
the shape of its input; dout has out's shape (B, Tq, H, Dv).)doc");

  m.def(
      "attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, bool causal,
         std::optional<double> scale, std::optional<std::string> backend) {
        const char* op = "attention";
        const AttnParams p = attn_params(view_of(op, "q", q), view_of(op, "k", k),
                                         view_of(op, "v", v), options(causal, scale, "signed", op));
        return forward(p, backend_of(backend, op)).out;
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("backend") = py::none(),
      R"doc(Standard softmax attention: q (B, Tq, H, D), k (B, Tk, G, D), v (B, Tk, G, Dv)
-> out (B, Tq, H, Dv). Head h reads group h // (H // G).)doc");

  m.def(
      "attention_backward",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& dout,
         bool causal, std::optional<double> scale, std::optional<std::string> backend) {
        const char* op = "attention_backward";
        const AttnParams p = attn_params(view_of(op, "q", q), view_of(op, "k", k),
                                         view_of(op, "v", v), options(causal, scale, "signed", op));
        const Backend b = backend_of(backend, op);
        return backward(forward(p, b), dout, b, op);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dout"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("backend") = py::none(),
      R"doc(Gradients of standard attention: returns (dq, dk, dv).)doc");

  m.def(
      "diff_attention_maps",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& lam,
         bool causal, std::optional<double> scale) {
        const char* op = "diff_attention_maps";
        const AttnParams p =
            diff_attn_params(view_of(op, "q", q), view_of(op, "k", k), view_of(op, "v", v),
                             view_of(op, "lam", lam), options(causal, scale, "signed", op));
        const Forward f = forward(p, Backend::Auto);
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
        const AttnParams p = attn_params(view_of(op, "q", q), view_of(op, "k", k),
                                         view_of(op, "v", v), options(causal, scale, "signed", op));
        return maps_of(forward(p, Backend::Auto), 0);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false,
      py::arg("scale") = py::none(),
      R"doc(The softmax map of standard attention, (B, H, Tq, Tk).)doc");
}

}  // namespace diffattn::python
