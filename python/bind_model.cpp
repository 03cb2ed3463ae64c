// Python bindings of the language model: diffattn.load_model(path) returns a Model with
// forward(tokens) -> logits (B, T, vocab), loss(tokens, targets) -> float (mean cross-entropy
// over all positions) and gradients(tokens, targets) -> {FORMAT.md name: array}. Tokens and
// targets are int64 NumPy arrays (B, T); anything else is a ValueError naming the argument.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "bind_common.h"
#include "diffattn/base/memory.h"
#include "diffattn/data/hf_tokenizer.h"
#include "diffattn/model/checkpoint.h"
#include "diffattn/model/config.h"
#include "diffattn/infer/session.h"
#include "diffattn/model/model.h"
#include "diffattn/model/safetensors.h"
#include "diffattn/nn/backend.h"
#include "diffattn/model/train_context.h"
#include "diffattn/train/train.h"

namespace py = pybind11;

namespace diffattn::python {

namespace {

// obj's shape checked as int64 (B, T), B, T >= 1, T at most max_seq_len; nothing is read yet.
py::array int64_tokens(const char* op, const char* name, const py::handle& obj, const model::Model& m, Shape& shape) {
  if (!py::isinstance<py::array>(obj)) {
    throw InvalidArgument(std::string(op) + ": " + name + " must be a NumPy int64 array (B, T), got " +
                          std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  const auto a = py::reinterpret_borrow<py::array>(obj);
  shape.assign(a.shape(), a.shape() + a.ndim());
  if (!a.dtype().is(py::dtype::of<int64_t>())) {
    throw InvalidArgument(std::string(op) + ": " + name + " must be int64, got " +
                          std::string(py::str(a.dtype())) + " array of shape " + shape_str(shape));
  }
  if (a.ndim() != 2 || shape[0] < 1 || shape[1] < 1) {
    throw InvalidArgument(std::string(op) + ": " + name + " has shape " + shape_str(shape) +
                          ", expected (B, T) with B, T >= 1");
  }
  if (shape[1] > m.config().max_seq_len) {
    throw InvalidArgument(std::string(op) + ": " + name + " has T = " + std::to_string(shape[1]) +
                          " positions, more than max_seq_len = " + std::to_string(m.config().max_seq_len));
  }
  return a;
}

// The ids of a checked (B, T) int64 array, read through its strides (a stride-0 view is read,
// never copied whole), each checked against the vocabulary.
std::vector<int32_t> token_ids(const char* op, const char* name, const py::array& a, const model::Model& m) {
  const auto r = py::reinterpret_borrow<py::array_t<int64_t>>(a).unchecked<2>();
  const int64_t V = m.config().vocab_size, B = r.shape(0), T = r.shape(1);
  std::vector<int32_t> out(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t id = r(b, t);
      if (id < 0 || id >= V) {
        throw InvalidArgument(std::string(op) + ": " + name + "[" + std::to_string(b) + ", " + std::to_string(t) +
                              "] = " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
      }
      out[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(id);
    }
  }
  return out;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  int64_t B = 0, T = 0;
};

// Shapes first, then the memory a forward (and backward) of (B, T) takes with its (B, T, vocab)
// logits, and only then are the ids read: a huge batch is an error naming it, before any work.
Batch batch_of(const char* op, const model::Model& m, const py::handle& tokens, const py::handle* targets) {
  Batch b;
  Shape ts, gs;
  const py::array ta = int64_tokens(op, "tokens", tokens, m, ts);
  py::array ga;
  if (targets) {
    ga = int64_tokens(op, "targets", *targets, m, gs);
    if (gs != ts) {
      throw InvalidArgument(std::string(op) + ": targets has shape " + shape_str(gs) +
                            ", expected the shape of tokens " + shape_str(ts));
    }
  }
  b.B = ts[0];
  b.T = ts[1];
  int64_t step = 0;
  try {
    step = train::train_step_bytes(m.config(), b.B, b.T);
  } catch (const InvalidArgument&) {
    step = INT64_MAX;  // the product overflows: more than any machine has
  }
  check_fits_in_memory(static_cast<double>(step) + 8.0 * static_cast<double>(b.B) * static_cast<double>(b.T) *
                                                       static_cast<double>(m.config().vocab_size),
                       std::string(op) + ": tokens of shape " + shape_str(ts) + " (a forward of B x T positions)");
  b.tokens = token_ids(op, "tokens", ta, m);
  if (targets) b.targets = token_ids(op, "targets", ga, m);
  return b;
}

py::dict tensors_of(const model::Model& m, const std::vector<float>& buf) {
  py::dict d;
  for (const model::TensorInfo& t : m.tensors()) {
    py::array_t<float> a = new_array(t.shape);
    std::memcpy(a.mutable_data(), buf.data() + t.offset, sizeof(float) * static_cast<size_t>(t.numel));
    d[py::str(t.name)] = a;
  }
  return d;
}

// Each call runs in its own TrainContext (the model is shared read only, so threads that
// released the GIL never share run state). V2's lambda is per token: the mean of the call's
// forward is kept on the Python object for lambdas().
void keep_lambdas(const py::object& self_obj, const model::TrainContext& run) {
  if (run.model().config().attention == nn::AttnKind::DiffV2) {
    self_obj.attr("_forward_lambdas") = py::cast(run.layer_lambdas());
  }
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<model::Model>(m, "Model", py::dynamic_attr(),
                    "A Differential Transformer language model (docs/FORMAT.md).")
      .def(
          "forward",
          [](const py::object& self_obj, const py::handle& tokens, const std::string& backend) {
            const model::Model& self = self_obj.cast<const model::Model&>();
            const nn::ExecContext& ctx = nn::context_named(backend, "Model.forward: backend");
            const Batch b = batch_of("Model.forward", self, tokens, nullptr);
            const int64_t V = self.config().vocab_size;
            if (self.config().recurrent()) {
              // Inference only: each row a fresh sequence through a session, every row's logits.
              py::array_t<float> out = new_array({b.B, b.T, V});
              float* o = out.mutable_data();
              py::gil_scoped_release nogil;
              for (int64_t r = 0; r < b.B; ++r) {
                infer::KvStore kv(self, infer::KvStore::Contiguous{b.T});
                infer::Session session(self, kv, ctx);
                infer::Batch batch;
                batch.add_chunk(b.tokens.data() + r * b.T, b.T, 0, 0, true);
                session.decode(batch, o + r * b.T * V);
              }
              return out;
            }
            model::TrainContext run(self, ctx);
            {
              py::gil_scoped_release nogil;
              run.forward(b.tokens.data(), nullptr, b.B, b.T);
            }
            keep_lambdas(self_obj, run);
            py::array_t<float> out = new_array({b.B, b.T, V});
            std::memcpy(out.mutable_data(), run.logits().data(), sizeof(float) * run.logits().size());
            return out;
          },
          py::arg("tokens"), py::kw_only(), py::arg("backend") = "cpu",
          "logits (B, T, vocab) of int64 tokens (B, T); backend \"reference\" runs the layers' hot ops "
          "on the reference table (loops in double, the attention oracle) instead of the fast kernels")
      .def(
          "loss",
          [](const py::object& self_obj, const py::handle& tokens, const py::handle& targets,
             const std::string& backend) {
            const model::Model& self = self_obj.cast<const model::Model&>();
            const nn::ExecContext& ctx = nn::context_named(backend, "Model.loss: backend");
            const Batch b = batch_of("Model.loss", self, tokens, &targets);
            model::TrainContext run(self, ctx);
            double loss = 0;
            {
              py::gil_scoped_release nogil;
              loss = run.forward(b.tokens.data(), b.targets.data(), b.B, b.T);
            }
            keep_lambdas(self_obj, run);
            return loss;
          },
          py::arg("tokens"), py::arg("targets"), py::kw_only(), py::arg("backend") = "cpu",
          "mean cross-entropy over all (B, T) positions (backend: as forward's)")
      .def(
          "gradients",
          [](const py::object& self_obj, const py::handle& tokens, const py::handle& targets,
             const std::string& backend) {
            const model::Model& self = self_obj.cast<const model::Model&>();
            const nn::ExecContext& ctx = nn::context_named(backend, "Model.gradients: backend");
            const Batch b = batch_of("Model.gradients", self, tokens, &targets);
            model::TrainContext run(self, ctx);
            {
              py::gil_scoped_release nogil;
              run.zero_grads();
              run.forward(b.tokens.data(), b.targets.data(), b.B, b.T);
              run.backward(1.0f);
            }
            keep_lambdas(self_obj, run);
            return tensors_of(self, run.grads());
          },
          py::arg("tokens"), py::arg("targets"), py::kw_only(), py::arg("backend") = "cpu",
          "gradients of the mean loss: {tensor name: array} for every FORMAT.md tensor (backend: as "
          "forward's; the reference runs the attention backward from the saved lse, the dense layers' "
          "backward is the host's either way)")
      .def(
          "parameters",
          [](const model::Model& self) {
            py::dict d;
            for (const model::TensorInfo& t : self.tensors()) {
              py::array_t<float> a = new_array(t.shape);
              const std::vector<float> w = self.weight_f32(t.name);
              std::memcpy(a.mutable_data(), w.data(), sizeof(float) * w.size());
              d[py::str(t.name)] = a;
            }
            return d;
          },
          "the weights: {tensor name: float32 array} (copies; BF16/F16 weights converted)")
      .def(
          "tensor",
          [](const py::object& self_obj, const std::string& name) {
            const model::Model& self = self_obj.cast<const model::Model&>();
            return tensor_view_object(self.weight(name), self_obj);
          },
          py::arg("name"),
          "the weight `name` in its stored type, without a copy: a read-only TensorView that "
          "torch.from_dlpack or numpy.from_dlpack reads in place (the model stays alive while it is used)")
      .def(
          "generate",
          [](const model::Model& self, const std::vector<int32_t>& prompt, int64_t max_new, double temperature,
             uint64_t seed, const std::vector<int32_t>& stop_ids, const std::string& kv_dtype) {
            infer::GenerateOptions o;
            o.max_new = max_new;
            o.sampler.temperature = temperature;
            o.sampler.seed = seed;
            o.stop_ids = stop_ids;
            o.kv_dtype = parse_dtype(kv_dtype, "kv_dtype");
            py::gil_scoped_release nogil;
            return infer::generate_ids(self, prompt, o);
          },
          py::arg("prompt_ids"), py::arg("max_new"), py::arg("temperature") = 0.0,
          py::arg("seed") = 0, py::arg("stop_ids") = std::vector<int32_t>{},
          py::arg("kv_dtype") = "f32",
          "new token ids continuing prompt_ids through the KV cache (temperature 0: greedy; "
          "kv_dtype 'f32', 'bf16' or 'f16' stores the cache in that type); stops at max_new, "
          "at max_seq_len or before an id in stop_ids")
      .def(
          "save",
          [](const model::Model& self, const std::string& path, const std::string& dtype, const std::string& format,
             int64_t shards) {
            const DType dt = parse_dtype(dtype, "Model.save: dtype");
            if (format != "diffattn" && format != "hf") {
              throw InvalidArgument("Model.save: format is \"" + format + "\", expected diffattn or hf");
            }
            if (format == "diffattn" && shards != 1) {
              throw InvalidArgument("Model.save: shards applies to format=\"hf\" (diffattn's format is one file)");
            }
            py::gil_scoped_release nogil;
            return format == "hf" ? model::save_hf_model(self, path, dt, shards) : model::save_model(self, path, dt);
          },
          py::arg("path"), py::arg("dtype") = "f32", py::arg("format") = "diffattn", py::arg("shards") = 1,
          "Writes the model as a directory (format 'diffattn' or 'hf': DiffLlama / Llama), replacing "
          "a model already there as one: at any moment, a kill included, the directory holds the "
          "old model or the new one, and its other files stay. Returns '' or a note on what of "
          "the old directory could not be put back.")
      .def_property_readonly("trainable", &model::Model::trainable,
                             "False for a model over weights kept as loaded (Hugging Face BF16/F16)")
      .def_property_readonly("storage", &model::Model::storage, "where the weights live")
      .def(
          "lambdas",
          [](const py::object& self_obj) -> py::object {
            if (py::hasattr(self_obj, "_forward_lambdas")) return self_obj.attr("_forward_lambdas");
            return py::cast(self_obj.cast<const model::Model&>().layer_lambdas());
          },
          "lambda per layer: V1 the scalar of Eq. 2; V2 the mean sigmoid of the last forward, "
          "loss or gradients call (NaN before one)")
      .def_property_readonly(
          "config",
          [](const model::Model& self) {
            return py::module_::import("json").attr("loads")(self.config().to_json());
          },
          "the config as a dict (config.json's keys, docs/FORMAT.md); diffattn.account takes it")
      .def_property_readonly("num_params", &model::Model::num_params);

  m.def(
      "load_model", [](const std::string& path) { return model::load_model(path); }, py::arg("path"),
      "Load a model directory (config.json + model.safetensors, docs/FORMAT.md). Errors name the "
      "file and the tensor or key: OSError for unreadable or corrupted files, ValueError for a "
      "config that is not diffattn/1.");

  m.def(
      "save_model",
      [](const std::string& path, const py::object& config_obj, const py::dict& tensors, const std::string& dtype) {
        const char* op = "save_model";
        // config: config.json's text, or the dict Model.config gives
        const std::string config = py::isinstance<py::str>(config_obj)
                                       ? config_obj.cast<std::string>()
                                       : py::str(py::module_::import("json").attr("dumps")(config_obj)).cast<std::string>();
        const model::ModelConfig cfg = model::ModelConfig::from_json(config, std::string(op) + ": config");
        const DType dt = parse_dtype(dtype, std::string(op) + ": dtype");
        for (auto item : tensors) {
          const std::string name = py::str(item.first);
          const auto& table = model::tensor_table(cfg);
          if (std::none_of(table.begin(), table.end(), [&](const model::TensorInfo& t) { return t.name == name; })) {
            throw InvalidArgument(std::string(op) + ": tensors[\"" + name + "\"] is not a tensor of this config");
          }
        }
        model::Model m(cfg);
        for (const model::TensorInfo& t : m.tensors()) {
          if (!tensors.contains(t.name)) {
            throw InvalidArgument(std::string(op) + ": tensors has no \"" + t.name + "\" of shape " + shape_str(t.shape));
          }
          const std::string label = "tensors[\"" + t.name + "\"]";
          const TensorView v = view_of(op, label.c_str(), tensors[py::str(t.name)]);
          check_shape(op, label.c_str(), v.shape, t.shape, "the config's");
          for (int64_t i = 0; i < t.numel; ++i) {
            if (!std::isfinite(v.f32()[i])) {
              throw InvalidArgument(std::string(op) + ": " + label + " holds " + (std::isnan(v.f32()[i]) ? "NaN" : "Inf") +
                                    " at flat index " + std::to_string(i));
            }
          }
          std::memcpy(m.params().data() + t.offset, v.f32(), sizeof(float) * static_cast<size_t>(t.numel));
        }
        py::gil_scoped_release nogil;
        return model::save_model(m, path, dt);
      },
      py::arg("path"), py::arg("config"), py::arg("tensors"), py::arg("dtype") = "f32",
      "Writes a model directory in diffattn's format from config.json's text and {FORMAT.md name: "
      "float32 array}: every tensor checked against the config (name, shape, finite values), then "
      "written as one replacement of the directory's model (a kill at any moment leaves the old "
      "model or the new one; the directory's other files stay).");

  m.def(
      "read_safetensors",
      [](const std::string& path) {
        const model::SafeTensorsFile f = model::read_safetensors(path);
        py::dict tensors;
        for (const auto& [name, t] : f.tensors) {
          py::array_t<float> a = new_array(t.shape);
          if (!t.data.empty()) std::memcpy(a.mutable_data(), t.data.data(), sizeof(float) * t.data.size());
          tensors[py::str(name)] = a;
        }
        return py::make_tuple(tensors, f.metadata);
      },
      py::arg("path"),
      "The tensors of a safetensors file as float32 arrays (F32, BF16 and F16 stored) and its "
      "metadata: (dict, dict). The file is checked as the safetensors library checks it (the "
      "tensors tile the data exactly, every shape and offset agrees); OSError names the file and "
      "the tensor.");

  py::class_<data::HfTokenizer>(m, "HfTokenizer",
                          "A Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3 and their "
                          "copies); ids equal the tokenizers library's.")
      .def_static("load", &data::HfTokenizer::load, py::arg("path"),
                  "Reads a tokenizer.json, or a directory holding one (OSError naming the file "
                  "and field for what is unsupported or broken).")
      .def_static("from_json", &data::HfTokenizer::from_json, py::arg("text"), py::arg("where") = "tokenizer.json")
      .def(
          "encode",
          [](const data::HfTokenizer& t, const std::string& text, bool add_special_tokens) {
            return t.encode(text, add_special_tokens);
          },
          py::arg("text"), py::arg("add_special_tokens") = false,
          "Token ids of a str; add_special_tokens applies the file's template (Llama 3: BOS).")
      .def(
          "decode",
          [](const data::HfTokenizer& self, const std::vector<int32_t>& ids, bool skip_special) {
            // Bytes that do not form whole UTF-8 characters (a character cut between tokens)
            // become U+FFFD, as the tokenizers library decodes; decode_bytes keeps them.
            const std::string b = self.decode(ids, skip_special);
            PyObject* o = PyUnicode_DecodeUTF8(b.data(), static_cast<Py_ssize_t>(b.size()), "replace");
            if (!o) throw py::error_already_set();
            return py::reinterpret_steal<py::str>(o);
          },
          py::arg("ids"), py::arg("skip_special") = false,
          "The text of ids (bytes that form no whole UTF-8 character become U+FFFD).")
      .def(
          "decode_bytes",
          [](const data::HfTokenizer& self, const std::vector<int32_t>& ids, bool skip_special) {
            return py::bytes(self.decode(ids, skip_special));
          },
          py::arg("ids"), py::arg("skip_special") = false, "The exact bytes of ids.")
      .def_property_readonly("vocab_size", &data::HfTokenizer::vocab_size)
      .def("token", &data::HfTokenizer::token, py::arg("id"))
      .def("id_of", &data::HfTokenizer::id_of, py::arg("token"), "The id of a token string, -1 if none.")
      .def("is_special", &data::HfTokenizer::is_special, py::arg("id"))
      .def_property_readonly("bos_id", &data::HfTokenizer::bos_id, "tokenizer_config.json's bos_token id, -1 if none")
      .def_property_readonly("eos_id", &data::HfTokenizer::eos_id, "tokenizer_config.json's eos_token id, -1 if none");
}

}  // namespace diffattn::python
