// Errors thrown by diffattn. Library code never exits: every failure is an exception whose
// message names what is wrong (the tensor, file or field, the expected and the actual value).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace diffattn {

// Base of every diffattn exception.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something invalid: a shape, a value, an option (Python: ValueError).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A file could not be read or written, or its contents are not what they should be
// (Python: OSError for I/O, ValueError for contents is decided by the subclass).
class IoError : public Error {
 public:
  using Error::Error;
};

using Shape = std::vector<int64_t>;

// "(2, 16, 8, 64)"
std::string shape_str(const Shape& shape);

}  // namespace diffattn
