// The messages' shared pieces (include/diffattn/base/error.h).
#include "diffattn/base/error.h"

#include <sstream>

namespace diffattn {

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '(';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ',';
  os << ')';
  return os.str();
}

}  // namespace diffattn
