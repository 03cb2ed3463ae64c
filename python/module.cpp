// The diffattn Python module (_core): error translation and the binding groups. The package
// diffattn/__init__.py re-exports it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "bind_common.h"

namespace py = pybind11;

namespace diffattn::python {

ConstView view_of(const char* op, const char* name, const py::handle& obj) {
  if (!py::isinstance<py::array>(obj)) {
    throw InvalidArgument(std::string(op) + ": " + name +
                          " must be a NumPy float32 array, got " +
                          std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  const auto a = py::reinterpret_borrow<py::array>(obj);
  Shape shape(a.shape(), a.shape() + a.ndim());
  if (!a.dtype().is(py::dtype::of<float>())) {
    throw InvalidArgument(std::string(op) + ": " + name + " must be float32, got " +
                          std::string(py::str(a.dtype())) + " array of shape " + shape_str(shape));
  }
  if (!(a.flags() & py::array::c_style)) {
    throw InvalidArgument(std::string(op) + ": " + name + " of shape " + shape_str(shape) +
                          " must be C-contiguous (use numpy.ascontiguousarray)");
  }
  return ConstView{static_cast<const float*>(a.data()), shape};
}

py::array_t<float> new_array(const Shape& shape) {
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  return py::array_t<float>(dims);
}

void check_shape(const char* op, const char* name, const Shape& got, const Shape& want,
                 const char* symbols) {
  if (got != want) {
    throw InvalidArgument(std::string(op) + ": " + name + " has shape " + shape_str(got) +
                          ", expected " + symbols + " = " + shape_str(want));
  }
}

}  // namespace diffattn::python

PYBIND11_MODULE(_core, m) {
  m.doc() = "diffattn: differential attention (arXiv:2410.05258) and the Differential Transformer";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const diffattn::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const diffattn::IoError& e) {
      PyErr_SetString(PyExc_OSError, e.what());
    }
  });
  diffattn::python::bind_kernels(m);
  diffattn::python::bind_model(m);
  diffattn::python::bind_eval(m);
}
