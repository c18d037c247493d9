// Tensor shapes. Dimensions are int64_t; a shape of rank 0 is a scalar with one element.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace lattice {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return int(dims_.size()); }
  // Negative indices count from the end: dim(-1) is the last dimension.
  int64_t dim(int i) const;
  int64_t operator[](int i) const { return dim(i); }
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }

  bool operator==(const Shape& other) const = default;
  std::string to_string() const;  // "[4, 64, 128]"

 private:
  std::vector<int64_t> dims_;
};

}  // namespace lattice
