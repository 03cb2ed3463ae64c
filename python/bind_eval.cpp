// Python bindings of the evidence layer: the k-way split reference, the signal-to-noise
// demonstration, the textbook's views and exercise 2, FORMAT.md accounting, and the writers of
// PNG heatmaps and .npy files (so plots can be made without matplotlib).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "bind_common.h"
#include "diffattn/eval/accounting.h"
#include "diffattn/eval/exercises.h"
#include "diffattn/eval/snr.h"
#include "diffattn/eval/views.h"
#include "diffattn/kernels/kway.h"
#include "diffattn/viz/viz.h"

namespace py = pybind11;

namespace diffattn::python {

namespace {

kernels::DiffMode mode_of(const std::string& mode, const char* op) {
  return kernels::parse_diff_mode(mode, std::string(op) + ": mode");
}

py::array_t<float> array_of(const std::vector<float>& v, const Shape& shape) {
  py::array_t<float> a = new_array(shape);
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::array_t<double> doubles(const std::vector<double>& v) {
  py::array_t<double> a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::dict stats(const eval::SnrStats& s) {
  py::dict d;
  d["snr"] = s.snr;
  d["snr_std"] = s.snr_std;
  d["found"] = s.found;
  d["signal_weight"] = s.signal_weight;
  return d;
}

eval::SnrConfig snr_config(int64_t length, int64_t head_dim, double signal, double noise,
                     double independent, double lam, int trials, uint64_t seed) {
  eval::SnrConfig c;
  c.length = length;
  c.head_dim = head_dim;
  c.signal = signal;
  c.noise = noise;
  c.independent = independent;
  c.lambda = lam;
  c.trials = trials;
  c.seed = seed;
  return c;
}

// A config dict with config.json's architecture keys (docs/FORMAT.md); absent keys stay unset
// and fail validation by name.
// A config dict: a whole config.json (it has "format") goes through the one config reader,
// ModelConfig::from_json, with every check; otherwise the architecture keys alone, the rest of
// FORMAT.md's keys accepted and ignored where they change no count.
model::ModelConfig arch_of(const py::dict& d) {
  if (d.contains("format")) {
    const std::string text = py::str(py::module_::import("json").attr("dumps")(d));
    return model::ModelConfig::from_json(text, "model config");
  }
  model::ModelConfig c;
  c.max_seq_len = 1;  // no tensor depends on it
  for (auto item : d) {
    const std::string key = py::str(item.first);
    if (key == "rope_theta" || key == "norm_eps" || key == "lambda_init" || key == "rope_scaling" ||
        key == "lambda_init_shift" || key == "subln_eps") {
      continue;  // no parameter, FLOP or cache byte depends on them
    }
    if (key == "attention") c.attention = model::parse_attn_kind(py::str(item.second), "model config");
    else if (key == "vocab_size") c.vocab_size = item.second.cast<int64_t>();
    else if (key == "d_model") c.d_model = item.second.cast<int64_t>();
    else if (key == "n_layers") c.n_layers = item.second.cast<int64_t>();
    else if (key == "ffn_dim") c.ffn_dim = item.second.cast<int64_t>();
    else if (key == "n_heads") c.n_heads = item.second.cast<int64_t>();
    else if (key == "n_kv_heads") c.n_kv_heads = item.second.cast<int64_t>();
    else if (key == "head_dim") c.head_dim = item.second.cast<int64_t>();
    else if (key == "tie_embeddings") c.tie_embeddings = item.second.cast<bool>();
    else if (key == "max_seq_len") c.max_seq_len = item.second.cast<int64_t>();
    else if (key == "attention_bias") c.attn_bias = item.second.cast<bool>();
    else if (key == "mlp_bias") c.mlp_bias = item.second.cast<bool>();
    else if (key == "noise_share") c.noise_share = item.second.cast<int64_t>();
    else if (key == "mlp") {
      const std::string v = py::str(item.second);
      if (v != "swiglu" && v != "polynorm") {
        throw InvalidArgument("model config: mlp is \"" + v + "\", expected \"swiglu\" or \"polynorm\"");
      }
      c.mlp = v == "polynorm" ? model::MlpKind::PolyNorm : model::MlpKind::SwiGLU;
    }
    else throw InvalidArgument("model config: unknown key \"" + key + "\"");
  }
  return c;
}

}  // namespace

void bind_eval(py::module_& m) {
  m.def(
      "kway_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& coef,
         bool causal, std::optional<double> scale, const std::string& mode) {
        const char* op = "kway_attention";
        const TensorView cv = view_of(op, "coef", coef);
        if (cv.shape.size() != 1) {
          throw InvalidArgument(std::string(op) + ": coef has shape " + shape_str(cv.shape) + ", expected (maps)");
        }
        kernels::AttnOptions o;
        o.causal = causal;
        o.mode = mode_of(mode, op);
        if (scale) o.scale = static_cast<float>(*scale);
        kernels::KWayParams p = kernels::kway_params(view_of(op, "q", q), view_of(op, "k", k), view_of(op, "v", v), cv,
                                   static_cast<int>(cv.shape[0]), o);
        py::array_t<float> out = new_array({p.B, p.Tq, p.H, p.Dv});
        py::array_t<float> probs = new_array({p.B, p.H, p.maps, p.Tq, p.Tk});
        py::array_t<float> weights = new_array({p.B, p.H, p.Tq, p.Tk});
        p.out = out.mutable_data();
        p.probs = probs.mutable_data();
        p.weights = weights.mutable_data();
        {
          py::gil_scoped_release nogil;
          kernels::kway_attention_ref(p);
        }
        return py::make_tuple(out, probs, weights);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("coef"), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("mode") = "signed",
      R"doc(k-way split reference: out = sum_m coef[m] softmax(s Q_m K_m^T) V.

q (B, Tq, maps*H, D) with map m of head h at sub-head maps*h + m; k (B, Tk, maps*H, D);
v (B, Tk, H, Dv); coef (maps). mode "clamp": max(sum_m c_m A_m, 0) renormalised per row.
Returns (out (B, Tq, H, Dv), probs (B, H, maps, Tq, Tk), weights (B, H, Tq, Tk)).)doc");

  m.def(
      "snr",
      [](int64_t length, int64_t head_dim, double signal, double noise, double independent,
         double lam, int trials, uint64_t seed, bool sweeps) {
        eval::SnrResult r;
        {
          py::gil_scoped_release nogil;
          r = eval::run_snr(snr_config(length, head_dim, signal, noise, independent, lam, trials, seed), sweeps);
        }
        py::dict d;
        d["standard"] = stats(r.standard);
        d["diff"] = stats(r.diff);
        d["ratio"] = r.ratio;
        d["example_standard"] = array_of(r.example_standard, {static_cast<int64_t>(r.example_standard.size())});
        d["example_diff"] = array_of(r.example_diff, {static_cast<int64_t>(r.example_diff.size())});
        d["example_position"] = r.example_position;
        if (sweeps) {
          py::list ls, ns;
          for (const eval::SnrLambdaPoint& p : r.lambda_sweep) {
            py::dict e = stats(p.diff);
            e["lambda"] = p.lambda;
            e["ratio"] = p.ratio;
            ls.append(e);
          }
          for (const eval::SnrNoisePoint& p : r.noise_sweep) {
            py::dict e;
            e["noise"] = p.noise;
            e["standard"] = stats(p.standard);
            e["diff"] = stats(p.diff);
            ns.append(e);
          }
          d["lambda_sweep"] = ls;
          d["best_lambda"] = r.best_lambda;
          d["noise_sweep"] = ns;
          d["standard_breakdown"] = r.standard_breakdown;
          d["diff_breakdown"] = r.diff_breakdown;
        }
        return d;
      },
      py::arg("length") = 1024, py::arg("head_dim") = 16, py::arg("signal") = 4.0,
      py::arg("noise") = 1.0, py::arg("independent") = 0.3, py::arg("lam") = 0.8,
      py::arg("trials") = 32, py::arg("seed") = 0, py::arg("sweeps") = false,
      R"doc(The signal-to-noise demonstration (`diffattn snr`; construction in include/diffattn/eval/snr.h).
Returns medians of SNR (signal weight / mean |other weight|), the paired ratio differential /
standard, and with sweeps=True the lambda and noise sweeps.)doc");

  m.def(
      "snr_trials",
      [](int64_t length, int64_t head_dim, double signal, double noise, double independent,
         double lam, int trials, uint64_t seed) {
        const eval::SnrTrials t = eval::snr_trials(snr_config(length, head_dim, signal, noise, independent, lam, trials, seed));
        py::dict d;
        d["snr_standard"] = doubles(t.snr_standard);
        d["snr_diff"] = doubles(t.snr_diff);
        d["weight_standard"] = doubles(t.weight_standard);
        d["weight_diff"] = doubles(t.weight_diff);
        d["found_standard"] = py::cast(t.found_standard);
        d["found_diff"] = py::cast(t.found_diff);
        return d;
      },
      py::arg("length") = 1024, py::arg("head_dim") = 16, py::arg("signal") = 4.0,
      py::arg("noise") = 1.0, py::arg("independent") = 0.3, py::arg("lam") = 0.8,
      py::arg("trials") = 32, py::arg("seed") = 0,
      R"doc(Per-trial SNRs and signal weights of one setting (weight_diff is the operator's output).)doc");

  m.def(
      "textbook_views",
      [](double lam, const std::string& mode, bool causal) {
        const eval::AttentionViews v = eval::textbook_views(static_cast<float>(lam), mode_of(mode, "textbook_views"), causal);
        py::dict d;
        d["tokens"] = v.tokens;
        for (auto [name, data] : {std::pair{"map1", &v.map1}, std::pair{"map2", &v.map2},
                                  std::pair{"diff", &v.diff}, std::pair{"standard", &v.standard}}) {
          d[name] = array_of(*data, {v.T, v.T});
        }
        d["out_diff"] = array_of(v.out_diff, {v.T, v.Dv});
        d["out_standard"] = array_of(v.out_standard, {v.T, v.Dv});
        return d;
      },
      py::arg("lam") = 0.4, py::arg("mode") = "signed", py::arg("causal") = false,
      R"doc(The four views (map1, map2, diff, standard; each (5, 5)) of the textbook's worked example.)doc");

  m.def(
      "exercise2",
      [] {
        const eval::Exercise2 e = eval::exercise2();
        py::dict d;
        d["loss_signed"] = e.loss_signed;
        d["loss_clamp"] = e.loss_clamp;
        d["dlam_signed"] = e.dlam_signed;
        d["dlam_signed_fd"] = e.dlam_signed_fd;
        d["dlam_clamp"] = e.dlam_clamp;
        d["dlam_clamp_fd"] = e.dlam_clamp_fd;
        return d;
      },
      R"doc(The textbook's Exercise 2: d sum(output) / d lambda on the worked example at lambda 0.4.)doc");

  m.def(
      "format_tensors",
      [](const py::dict& config) {
        py::list out;
        for (const eval::TensorSpec& t : eval::format_tensors(arch_of(config))) {
          out.append(py::make_tuple(t.name, py::tuple(py::cast(t.shape)), t.component));
        }
        return out;
      },
      py::arg("config"),
      R"doc(FORMAT.md's tensors of a config dict (attention, vocab_size, d_model, n_layers, ffn_dim,
n_heads, n_kv_heads, head_dim, tie_embeddings) as (name, shape, component) tuples.)doc");

  m.def(
      "account",
      [](const py::dict& config, int64_t context, double kv_bytes) {
        const eval::Accounting a = eval::account(arch_of(config), context, kv_bytes);
        py::dict d;
        d["params"] = a.params;
        d["params_by_component"] = a.params_by_component;
        d["linear_flops_per_token"] = a.linear_flops_per_token;
        d["attn_flops_per_token"] = a.attn_flops_per_token;
        d["kv_cache_bytes_per_token"] = a.kv_cache_bytes_per_token;
        d["decode_read_bytes_fused"] = a.decode_read_bytes_fused;
        d["decode_read_bytes_two_pass"] = a.decode_read_bytes_two_pass;
        return d;
      },
      py::arg("config"), py::arg("context") = 4096, py::arg("kv_bytes") = 2.0,
      R"doc(Parameters, FLOPs per token at a context and KV-cache bytes per token of a config dict.)doc");

  m.def(
      "write_npy",
      [](const std::string& path, const py::handle& array) {
        const TensorView v = view_of("write_npy", "array", array);
        py::gil_scoped_release nogil;
        viz::write_npy(path, v.f32(), v.shape);
      },
      py::arg("path"), py::arg("array"),
      R"doc(Writes a float32 C-contiguous array as .npy (format 1.0), atomically.)doc");

  m.def(
      "write_png",
      [](const std::string& path, const py::array_t<uint8_t, py::array::c_style>& rgb) {
        if (rgb.ndim() != 3 || rgb.shape(2) != 3) {
          throw InvalidArgument("write_png: rgb must be a (height, width, 3) uint8 array");
        }
        viz::Canvas c(static_cast<int>(rgb.shape(1)), static_cast<int>(rgb.shape(0)));
        const uint8_t* p = rgb.data();
        for (int y = 0; y < c.height(); ++y) {
          for (int x = 0; x < c.width(); ++x, p += 3) c.set(x, y, {p[0], p[1], p[2]});
        }
        viz::write_png(path, c);
      },
      py::arg("path"), py::arg("rgb"), R"doc(Writes a (H, W, 3) uint8 image as PNG, atomically.)doc");

  m.def(
      "render_heatmap",
      [](const std::string& path, const py::handle& matrix, std::vector<std::string> row_labels,
         std::vector<std::string> col_labels, const std::string& title, bool signed_scale) {
        const TensorView v = view_of("render_heatmap", "matrix", matrix);
        if (v.shape.size() != 2) {
          throw InvalidArgument("render_heatmap: matrix has shape " + shape_str(v.shape) + ", expected (rows, cols)");
        }
        viz::HeatmapSpec spec;
        spec.title = title;
        spec.row_labels = std::move(row_labels);
        spec.col_labels = std::move(col_labels);
        spec.scale = signed_scale ? viz::ColorScale::Diverging : viz::ColorScale::Sequential;
        const viz::Canvas c = viz::render_heatmap(v.f32(), static_cast<int>(v.shape[0]),
                                                  static_cast<int>(v.shape[1]), spec);
        viz::write_png(path, c);
        return py::make_tuple(c.width(), c.height());
      },
      py::arg("path"), py::arg("matrix"), py::arg("row_labels") = std::vector<std::string>{},
      py::arg("col_labels") = std::vector<std::string>{}, py::arg("title") = "",
      py::arg("signed") = false,
      R"doc(Renders a float32 (rows, cols) matrix as a labelled heatmap PNG (signed=True: diverging
colour map centred on zero). Returns the image's (width, height).)doc");
}

}  // namespace diffattn::python
