// Helpers shared by the binding files: checked views of NumPy arrays and new output arrays.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "diffattn/base/error.h"
#include "diffattn/kernels/attention.h"

namespace diffattn::python {

// A read-only view of a NumPy float32 C-contiguous array; anything else is a ValueError that
// names the tensor and says what it got.
TensorView view_of(const char* op, const char* name, const pybind11::handle& obj);

// A read-only view of a NumPy float32 array with any non-negative strides (a whole number of
// elements each); the kernels check what they can read. No copy.
TensorView strided_view_of(const char* op, const char* name, const pybind11::handle& obj);

// A new float32 array of the given shape laid out with the given element strides (uninitialised;
// its buffer spans what the strides reach, so a gradient can take its input's layout).
pybind11::array_t<float> new_strided_array(const Shape& shape, const Shape& strides);

// A new float32 array of the given shape (uninitialised).
pybind11::array_t<float> new_array(const Shape& shape);

// Throws InvalidArgument when got != want.
void check_shape(const char* op, const char* name, const Shape& got, const Shape& want,
                 const char* symbols);

// A Python TensorView (bind_view.cpp) of v, keeping owner (the object holding v's memory) alive
// while the view or a DLPack consumer of it lives.
pybind11::object tensor_view_object(const TensorView& v, const pybind11::object& owner);

void bind_kernels(pybind11::module_& m);
void bind_model(pybind11::module_& m);
void bind_eval(pybind11::module_& m);
void bind_tensors(pybind11::module_& m);
void bind_view(pybind11::module_& m);
void bind_tokenize(pybind11::module_& m);

}  // namespace diffattn::python
