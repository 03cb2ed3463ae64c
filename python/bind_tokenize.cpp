// Python binding of chat templates (include/diffattn/tokenize/chat_template.h): a template
// parsed once and rendered with Python values, as transformers' apply_chat_template renders it.
// Errors are ValueError naming the template, line and column.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "bind_common.h"
#include "diffattn/tokenize/chat_template.h"

namespace py = pybind11;

namespace diffattn::python {

namespace {

using ojson = nlohmann::ordered_json;

// A Python value (dict with str keys, list, tuple, str, int, float, bool, None) as JSON that keeps
// the dicts' key order; anything else is a ValueError naming where it is.
ojson to_json(const py::handle& v, const std::string& where, int depth) {
  if (depth > 128) throw InvalidArgument(where + ": nested deeper than 128 levels");
  if (v.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) {
    try {
      return v.cast<int64_t>();
    } catch (const py::cast_error&) {
      throw InvalidArgument(where + ": an integer outside the 64-bit range");
    }
  }
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::dict>(v)) {
    ojson o = ojson::object();
    for (const auto& [k, x] : v.cast<py::dict>()) {
      if (!py::isinstance<py::str>(k)) throw InvalidArgument(where + ": dict keys must be str");
      const std::string key = k.cast<std::string>();
      o[key] = to_json(x, where + "[" + key + "]", depth + 1);
    }
    return o;
  }
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    ojson a = ojson::array();
    size_t i = 0;
    for (const auto& x : v) a.push_back(to_json(x, where + "[" + std::to_string(i++) + "]", depth + 1));
    return a;
  }
  throw InvalidArgument(where + ": unsupported type " + std::string(py::str(py::type::of(v).attr("__name__"))) +
                        " (use dict, list, str, int, float, bool or None)");
}

}  // namespace

void bind_tokenize(py::module_& m) {
  py::class_<tokenize::ChatTemplate>(m, "ChatTemplate",
                                     "A chat template (Jinja) parsed once by diffattn's own engine, rendered as "
                                     "transformers' apply_chat_template renders it with jinja2.")
      .def(py::init([](const std::string& source, const std::string& name) {
             return tokenize::ChatTemplate::parse(source, name);
           }),
           py::arg("source"), py::arg("name") = "<template>",
           "Parses the template; a ValueError names the line and column of a syntax error.")
      .def_property_readonly("name", &tokenize::ChatTemplate::name, "The name used in error messages.")
      .def(
          "render",
          [](const tokenize::ChatTemplate& t, const py::object& messages, bool add_generation_prompt,
             const py::object& tools, const py::object& documents, std::optional<std::string> bos_token,
             std::optional<std::string> eos_token, const py::object& now, const py::kwargs& extra) {
            tokenize::RenderOptions o;
            o.add_generation_prompt = add_generation_prompt;
            o.tools = to_json(tools, "tools", 0);
            o.documents = to_json(documents, "documents", 0);
            o.bos_token = std::move(bos_token);
            o.eos_token = std::move(eos_token);
            for (const auto& [k, v] : extra) o.extra[k.cast<std::string>()] = to_json(v, k.cast<std::string>(), 0);
            if (!now.is_none()) {
              o.now = tokenize::DateTime{now.attr("year").cast<int>(),   now.attr("month").cast<int>(),
                                         now.attr("day").cast<int>(),    now.attr("hour").cast<int>(),
                                         now.attr("minute").cast<int>(), now.attr("second").cast<int>(),
                                         now.attr("microsecond").cast<int>()};
            }
            const ojson msgs = to_json(messages, "messages", 0);
            py::gil_scoped_release release;
            return t.render(msgs, o);
          },
          py::arg("messages"), py::kw_only(), py::arg("add_generation_prompt") = false, py::arg("tools") = py::none(),
          py::arg("documents") = py::none(), py::arg("bos_token") = py::none(), py::arg("eos_token") = py::none(),
          py::arg("now") = py::none(),
          "Renders the conversation (a list of message dicts). bos_token / eos_token None: not passed (the "
          "template sees them undefined). now: a datetime for strftime_now (default: the local clock). More "
          "keyword arguments become template variables. A template error is a ValueError.");
}

}  // namespace diffattn::python
