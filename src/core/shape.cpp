#include "core/shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace lattice {

int64_t Shape::dim(int i) const {
  int r = rank();
  int index = i < 0 ? i + r : i;
  LATTICE_CHECK(index >= 0 && index < r, "dimension {} out of range for shape {}", i, to_string());
  return dims_[size_t(index)];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

std::string Shape::to_string() const {
  return fmt::format("[{}]", fmt::join(dims_, ", "));
}

}  // namespace lattice
