// Tensor: a dtype, a shape and contiguous row-major storage, either owned (allocated from an
// Arena and returned to it when the last Tensor referring to it goes away) or borrowed (memory
// the caller keeps alive). Copying a Tensor copies the reference, not the bytes (like a view);
// use copy_from() to copy values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/arena.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace lattice {

class Tensor {
 public:
  Tensor() = default;  // undefined: no storage

  // Uninitialised storage from `arena`, accounted under `category`.
  static Tensor empty(Arena& arena, Shape shape, DType dtype,
                      MemoryCategory category = MemoryCategory::kActivations);
  static Tensor zeros(Arena& arena, Shape shape, DType dtype,
                      MemoryCategory category = MemoryCategory::kActivations);
  // Wraps caller-owned memory; the caller keeps it alive as long as the Tensor is used.
  static Tensor borrow(void* data, Shape shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_.dim(i); }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool is_borrowed() const;

  void* raw_data() const;
  // Typed access; throws DTypeError if T does not match dtype().
  template <class T>
  T* data() const {
    if (DTypeOf<T>::value != dtype_) throw_dtype_mismatch(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }

  // Same storage, another shape with the same number of elements.
  Tensor view(Shape shape) const;
  // Rows [begin, end) along dimension 0, sharing storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;

  void zero_();
  // Copies values from `src` of the same shape; converts between float dtypes.
  void copy_from(const Tensor& src);

  std::string describe() const;  // "f32[4, 64]"

 private:
  struct Storage;
  [[noreturn]] void throw_dtype_mismatch(DType requested) const;

  std::shared_ptr<Storage> storage_;
  size_t byte_offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

// Argument validation for kernels and layers. `op` and `what` name the call and the argument
// in the message: "layernorm_forward: 'weight' has shape [64], expected [128]".
void expect_defined(const Tensor& t, std::string_view op, std::string_view what);
void expect_dtype(const Tensor& t, DType dtype, std::string_view op, std::string_view what);
void expect_float_dtype(const Tensor& t, std::string_view op, std::string_view what);
void expect_shape(const Tensor& t, const Shape& shape, std::string_view op, std::string_view what);
void expect_rank(const Tensor& t, int rank, std::string_view op, std::string_view what);
void expect_same_shape(const Tensor& a, const Tensor& b, std::string_view op,
                       std::string_view what_a, std::string_view what_b);

}  // namespace lattice
