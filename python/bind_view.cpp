// TensorView in Python: a read-only view of a tensor the library holds (a model's weight in its
// stored type), exported through the DLPack protocol (__dlpack__, __dlpack_device__) so that
// torch.from_dlpack, numpy.from_dlpack and other consumers read it without a copy; and
// TensorView.from_dlpack, the other direction (any producer's tensor as a view).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "bind_common.h"
#include "diffattn/base/tensor.h"

namespace py = pybind11;

namespace diffattn::python {

namespace {

const char* dtype_label(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
  }
  return "unknown";
}

// A view and the Python object that keeps its memory alive (the model it came from).
struct PyTensorView {
  TensorView view;
  py::object owner;
};

// The owner as the DLPack handle keeps it: a reference to the Python object, dropped with the GIL
// held (a consumer may call the deleter from any thread).
std::shared_ptr<const void> hold(const py::object& owner) {
  auto* ref = new py::object(owner);
  return std::shared_ptr<const void>(ref, [](const void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<const py::object*>(p);
  });
}

// A capsule a consumer has not taken (its name unchanged) frees its handle.
template <class Managed>
void free_untaken(PyObject* capsule, const char* name) {
  if (!PyCapsule_IsValid(capsule, name)) return;  // taken: renamed "used_..." by the consumer
  auto* m = static_cast<Managed*>(PyCapsule_GetPointer(capsule, name));
  if (m != nullptr && m->deleter != nullptr) m->deleter(m);
}

// stream: the consumer's CUDA stream; the views are written before they are handed out (host
// memory, or device memory the library synchronised), so there is nothing to order against it.
py::object dlpack_capsule(const PyTensorView& self, const py::object& /*stream*/, const py::object& max_version,
                          const py::object& dl_device, const py::object& copy) {
  if (!dl_device.is_none()) {
    const auto dev = dl_device.cast<std::tuple<int, int>>();
    if (std::get<0>(dev) != static_cast<int>(self.view.device.type) || std::get<1>(dev) != self.view.device.id) {
      throw py::buffer_error("TensorView.__dlpack__: dl_device " + std::to_string(std::get<0>(dev)) + ", " +
                             std::to_string(std::get<1>(dev)) +
                             " differs from the view's device; copy the tensor with the consumer instead");
    }
  }
  if (!copy.is_none() && copy.cast<bool>()) {
    throw py::buffer_error("TensorView.__dlpack__: copy=True is not supported (the view is exported in place; "
                           "copy with the consumer, e.g. torch.from_dlpack(v).clone())");
  }
  bool versioned = false;
  if (!max_version.is_none()) {
    const auto mv = max_version.cast<std::tuple<int, int>>();
    versioned = std::get<0>(mv) >= 1;
  }
  if (versioned) {
    dlpack::DLManagedTensorVersioned* m = to_dlpack_versioned(self.view, hold(self.owner));
    PyObject* c = PyCapsule_New(m, "dltensor_versioned", [](PyObject* cap) {
      free_untaken<dlpack::DLManagedTensorVersioned>(cap, "dltensor_versioned");
    });
    if (c == nullptr) {
      m->deleter(m);
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(c);
  }
  dlpack::DLManagedTensor* m = to_dlpack(self.view, hold(self.owner));
  PyObject* c = PyCapsule_New(m, "dltensor", [](PyObject* cap) { free_untaken<dlpack::DLManagedTensor>(cap, "dltensor"); });
  if (c == nullptr) {
    m->deleter(m);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(c);
}

// A view of any DLPack producer's tensor (torch, numpy, jax, ...): the object's __dlpack__()
// capsule taken as the protocol says (renamed "used_dltensor", its deleter ours to call), the
// view made by diffattn::from_dlpack (which refuses what the library cannot read, naming it),
// and the producer's tensor kept alive by the view's owner until the view goes.
PyTensorView view_from_dlpack(const py::object& obj) {
  const char* what = "TensorView.from_dlpack";
  if (!py::hasattr(obj, "__dlpack__")) {
    throw py::type_error(std::string(what) + ": " + py::str(py::type::of(obj)).cast<std::string>() +
                         " has no __dlpack__ (expected a tensor: torch, numpy, jax, ...)");
  }
  py::object cap = obj.attr("__dlpack__")();
  PyObject* c = cap.ptr();
  if (!PyCapsule_IsValid(c, "dltensor")) {
    throw py::value_error(std::string(what) + ": __dlpack__() gave no unused \"dltensor\" capsule");
  }
  auto* m = static_cast<dlpack::DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
  // Ours from here: the owner calls the producer's deleter when the view goes (and now, on error).
  auto free_managed = [](void* p) {
    auto* mt = static_cast<dlpack::DLManagedTensor*>(p);
    if (mt->deleter != nullptr) mt->deleter(mt);
  };
  if (PyCapsule_SetName(c, "used_dltensor") != 0) throw py::error_already_set();
  py::capsule owner(static_cast<void*>(m), free_managed);
  return PyTensorView{from_dlpack(m->dl_tensor, what), owner};
}

}  // namespace

py::object tensor_view_object(const TensorView& v, const py::object& owner) {
  return py::cast(PyTensorView{v, owner});
}

void bind_view(py::module_& m) {
  py::class_<PyTensorView>(m, "TensorView",
                           "A read-only view of a tensor the library holds: shape, dtype, device, and the DLPack "
                           "protocol (torch.from_dlpack(view) reads it without a copy; a BF16 weight stays "
                           "bfloat16). Writing through what a consumer makes of it is undefined: a memory-mapped "
                           "weight file is mapped read only.")
      .def_property_readonly("shape", [](const PyTensorView& s) { return py::tuple(py::cast(s.view.shape.vec())); })
      .def_property_readonly("strides", [](const PyTensorView& s) {
        return py::tuple(py::cast(s.view.effective_strides().vec()));
      }, "element strides (not bytes), outermost first")
      .def_property_readonly("dtype", [](const PyTensorView& s) { return std::string(dtype_label(s.view.dtype)); })
      .def_property_readonly("device", [](const PyTensorView& s) { return std::string(device_name(s.view.device.type)); })
      .def("__dlpack__", &dlpack_capsule, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
           "a DLPack capsule of the view (versioned and flagged read only when max_version >= (1, 0))")
      .def("__dlpack_device__", [](const PyTensorView& s) {
        return py::make_tuple(static_cast<int>(s.view.device.type), s.view.device.id);
      })
      .def_static("from_dlpack", &view_from_dlpack, py::arg("tensor"),
                  "A view of another library's tensor through its __dlpack__ (no copy; float32, "
                  "bfloat16 or float16, on the CPU or CUDA, at most 6 dimensions: anything else is a "
                  "ValueError naming it). The tensor is kept alive while the view is.")
      .def("__repr__", [](const PyTensorView& s) {
        return "TensorView(shape=" + shape_str(s.view.shape.vec()) + ", dtype=" + dtype_label(s.view.dtype) +
               ", device=" + device_name(s.view.device.type) + ")";
      });
}

}  // namespace diffattn::python
