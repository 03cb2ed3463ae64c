// The diffattn Python module (_core): error translation and the binding groups. The package
// diffattn/__init__.py re-exports it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bind_common.h"
#include "diffattn/base/memory.h"

namespace py = pybind11;

namespace diffattn::python {

namespace {

// Output arrays above this size are checked against the machine's memory before allocation
// (smaller ones cost a check each call and cannot exhaust it).
constexpr double kCheckedArrayBytes = 64.0 * (1 << 20);

// obj as a float32 NumPy array, or an error naming op, name, type and dtype; shape filled.
py::array float32_array(const char* op, const char* name, const py::handle& obj, Shape& shape) {
  if (!py::isinstance<py::array>(obj)) {
    throw InvalidArgument(std::string(op) + ": " + name +
                          " must be a NumPy float32 array, got " +
                          std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  const auto a = py::reinterpret_borrow<py::array>(obj);
  shape.assign(a.shape(), a.shape() + a.ndim());
  if (!a.dtype().is(py::dtype::of<float>())) {
    throw InvalidArgument(std::string(op) + ": " + name + " must be float32, got " +
                          std::string(py::str(a.dtype())) + " array of shape " + shape_str(shape));
  }
  return a;
}

}  // namespace

TensorView view_of(const char* op, const char* name, const py::handle& obj) {
  Shape shape;
  const py::array a = float32_array(op, name, obj, shape);
  if (!(a.flags() & py::array::c_style)) {
    throw InvalidArgument(std::string(op) + ": " + name + " of shape " + shape_str(shape) +
                          " must be C-contiguous (use numpy.ascontiguousarray)");
  }
  return TensorView(static_cast<const float*>(a.data()), shape);
}

TensorView strided_view_of(const char* op, const char* name, const py::handle& obj) {
  Shape shape;
  const py::array a = float32_array(op, name, obj, shape);
  if (reinterpret_cast<uintptr_t>(a.data()) % alignof(float) != 0) {
    throw InvalidArgument(std::string(op) + ": " + name + " of shape " + shape_str(shape) +
                          " is not aligned to 4 bytes (use numpy.ascontiguousarray)");
  }
  Shape strides(static_cast<size_t>(a.ndim()));
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    const py::ssize_t bytes = a.strides()[i];
    if (bytes % static_cast<py::ssize_t>(sizeof(float)) != 0) {
      throw InvalidArgument(std::string(op) + ": " + name + " of shape " + shape_str(shape) +
                            " has a stride of " + std::to_string(bytes) +
                            " bytes, not a whole number of float32 elements");
    }
    strides[static_cast<size_t>(i)] = bytes / static_cast<py::ssize_t>(sizeof(float));
  }
  return TensorView(static_cast<const float*>(a.data()), shape, strides);
}

py::array_t<float> new_strided_array(const Shape& shape, const Shape& strides) {
  int64_t span = 1;  // the furthest element the strides reach, plus one
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return new_array(shape);
    span += (shape[i] - 1) * std::max<int64_t>(strides[i], 0);
  }
  if (4.0 * static_cast<double>(span) > kCheckedArrayBytes) {
    check_fits_in_memory(4.0 * static_cast<double>(span), "an output array of shape " + shape_str(shape));
  }
  py::array_t<float> buffer(static_cast<py::ssize_t>(span));
  std::vector<py::ssize_t> dims(shape.begin(), shape.end()), bytes(strides.size());
  for (size_t i = 0; i < strides.size(); ++i) {
    bytes[i] = static_cast<py::ssize_t>(strides[i] * static_cast<int64_t>(sizeof(float)));
  }
  return py::array_t<float>(dims, bytes, buffer.mutable_data(), buffer);
}

py::array_t<float> new_array(const Shape& shape) {
  // Sized by the caller's arrays (a stride-0 view is a few bytes whatever its shape): checked
  // against the machine's memory first, an error naming the shape rather than a bad_alloc.
  double bytes = 4.0;
  for (int64_t n : shape) bytes *= static_cast<double>(n);
  if (bytes > kCheckedArrayBytes) check_fits_in_memory(bytes, "an output array of shape " + shape_str(shape));
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  return py::array_t<float>(dims);
}

// A message may quote bytes from a file (a key that is not UTF-8): decoded with
// backslashreplace, so the exception always carries its message (PyErr_SetString would end in
// a UnicodeDecodeError without it).
void set_error(PyObject* type, const char* what) {
  PyObject* msg = PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)), "backslashreplace");
  if (msg == nullptr) {
    PyErr_Clear();
    msg = PyUnicode_FromString("(an error whose message could not be decoded)");
  }
  PyErr_SetObject(type, msg);
  Py_XDECREF(msg);
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
  m.attr("__version__") = DIFFATTN_VERSION;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const diffattn::InvalidArgument& e) {
      diffattn::python::set_error(PyExc_ValueError, e.what());
    } catch (const diffattn::IoError& e) {
      diffattn::python::set_error(PyExc_OSError, e.what());
    } catch (const diffattn::Error& e) {
      diffattn::python::set_error(PyExc_RuntimeError, e.what());
    }
  });
  diffattn::python::bind_view(m);
  diffattn::python::bind_kernels(m);
  diffattn::python::bind_model(m);
  diffattn::python::bind_eval(m);
  diffattn::python::bind_tensors(m);
  diffattn::python::bind_tokenize(m);
}
