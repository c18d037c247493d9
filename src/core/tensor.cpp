#include "core/tensor.h"

#include <cstring>

#include "core/kernel_profile.h"

namespace lattice {

struct Tensor::Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Arena* arena = nullptr;  // null when borrowed

  Storage(void* d, size_t b, Arena* a) : data(d), bytes(b), arena(a) {}
  ~Storage() {
    if (arena != nullptr) arena->release(data);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

Tensor Tensor::empty(Arena& arena, Shape shape, DType dtype, MemoryCategory category) {
  for (int64_t d : shape.dims()) {
    if (d < 0)
      LATTICE_THROW(ShapeError, "Tensor::empty: negative dimension in {}", shape.to_string());
  }
  Tensor t;
  size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  t.storage_ = std::make_shared<Storage>(arena.allocate(bytes, category), bytes, &arena);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(Arena& arena, Shape shape, DType dtype, MemoryCategory category) {
  Tensor t = empty(arena, std::move(shape), dtype, category);
  t.zero_();
  return t;
}

Tensor Tensor::borrow(void* data, Shape shape, DType dtype) {
  if (data == nullptr && shape.numel() > 0) {
    LATTICE_THROW(ValueError, "Tensor::borrow: null storage for a {} tensor of shape {}",
                  dtype_name(dtype), shape.to_string());
  }
  Tensor t;
  size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  t.storage_ = std::make_shared<Storage>(data, bytes, nullptr);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

bool Tensor::is_borrowed() const {
  return storage_ != nullptr && storage_->arena == nullptr;
}

void* Tensor::raw_data() const {
  if (storage_ == nullptr) {
    LATTICE_THROW(ValueError, "access to the data of an undefined tensor (no storage)");
  }
  return static_cast<std::byte*>(storage_->data) + byte_offset_;
}

Tensor Tensor::view(Shape shape) const {
  if (shape.numel() != numel()) {
    LATTICE_THROW(ShapeError, "Tensor::view: cannot view {} ({} elements) as {} ({} elements)",
                  shape_.to_string(), numel(), shape.to_string(), shape.numel());
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  LATTICE_CHECK(rank() >= 1, "slice_rows of a scalar");
  int64_t rows = dim(0);
  if (begin < 0 || end < begin || end > rows) {
    LATTICE_THROW(ShapeError, "Tensor::slice_rows: [{}, {}) out of range for {}", begin, end,
                  shape_.to_string());
  }
  int64_t row_elements = rows == 0 ? 0 : numel() / rows;
  std::vector<int64_t> dims = shape_.dims();
  dims[0] = end - begin;
  Tensor t = *this;
  t.byte_offset_ += size_t(begin * row_elements) * dtype_size(dtype_);
  t.shape_ = Shape(std::move(dims));
  return t;
}

void Tensor::zero_() {
  if (numel() > 0) std::memset(raw_data(), 0, nbytes());
}

void Tensor::copy_from(const Tensor& src) {
  expect_defined(src, "Tensor::copy_from", "src");
  expect_same_shape(*this, src, "Tensor::copy_from", "destination", "source");
  if (numel() == 0) return;
  const KernelTimer timer(src.dtype() == dtype_ ? "copy" : "cast", 0,
                          double(nbytes() + src.nbytes()));
  if (src.dtype() == dtype_) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  convert(src.raw_data(), src.dtype(), raw_data(), dtype_, numel());
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return fmt::format("{}{}", dtype_name(dtype_), shape_.to_string());
}

void Tensor::throw_dtype_mismatch(DType requested) const {
  LATTICE_THROW(DTypeError, "tensor {} accessed as {}", describe(), dtype_name(requested));
}

void expect_defined(const Tensor& t, std::string_view op, std::string_view what) {
  if (!t.defined()) {
    LATTICE_THROW(ValueError, "{}: '{}' is undefined (null storage) ---> HINT: allocate it first",
                  op, what);
  }
}

void expect_dtype(const Tensor& t, DType dtype, std::string_view op, std::string_view what) {
  expect_defined(t, op, what);
  if (t.dtype() != dtype) {
    LATTICE_THROW(DTypeError, "{}: '{}' has dtype {}, expected {}", op, what, dtype_name(t.dtype()),
                  dtype_name(dtype));
  }
}

void expect_float_dtype(const Tensor& t, std::string_view op, std::string_view what) {
  expect_defined(t, op, what);
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16) {
    LATTICE_THROW(DTypeError, "{}: '{}' has dtype {}, expected f32 or bf16", op, what,
                  dtype_name(t.dtype()));
  }
}

void expect_shape(const Tensor& t, const Shape& shape, std::string_view op, std::string_view what) {
  expect_defined(t, op, what);
  if (t.shape() != shape) {
    LATTICE_THROW(ShapeError, "{}: '{}' has shape {}, expected {}", op, what, t.shape().to_string(),
                  shape.to_string());
  }
}

void expect_rank(const Tensor& t, int rank, std::string_view op, std::string_view what) {
  expect_defined(t, op, what);
  if (t.rank() != rank) {
    LATTICE_THROW(ShapeError, "{}: '{}' has shape {} (rank {}), expected rank {}", op, what,
                  t.shape().to_string(), t.rank(), rank);
  }
}

void expect_same_shape(const Tensor& a, const Tensor& b, std::string_view op,
                       std::string_view what_a, std::string_view what_b) {
  expect_defined(a, op, what_a);
  expect_defined(b, op, what_b);
  if (a.shape() != b.shape()) {
    LATTICE_THROW(ShapeError, "{}: '{}' has shape {} but '{}' has shape {}", op, what_a,
                  a.shape().to_string(), what_b, b.shape().to_string());
  }
}

}  // namespace lattice
