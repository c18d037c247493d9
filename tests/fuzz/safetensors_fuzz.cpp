// The safetensors reader (ckpt/safetensors.h) on a hostile file: opened as a file (it maps
// it), then every tensor it accepted read the ways the product reads them: whole into the
// arena, converted to f32, and a row range as a tensor-parallel shard does.
#include "ckpt/safetensors.h"
#include "core/arena.h"
#include "fuzz/fuzz_target.h"

LATTICE_FUZZ_TARGET(safetensors) {
  using namespace lattice;
  const SafetensorsReader reader(fuzz::write_input_file(input, "input.safetensors"));
  Arena arena("fuzz", size_t(1) << 20);
  for (const SafetensorsTensorInfo& info : reader.tensors()) {
    (void)reader.bytes(info.name);
    { const Tensor whole = reader.load(info.name, arena); }
    if (info.dtype != DType::kI32) {
      const Tensor f32 = Tensor::empty(arena, info.shape, DType::kF32);
      reader.read(info.name, f32, DTypePolicy::kConvert);
    }
    if (info.shape.rank() >= 1 && info.shape.dim(0) > 0) {
      std::vector<int64_t> dims = info.shape.dims();
      const int64_t rows = dims[0];
      dims[0] = rows - rows / 2;
      const Tensor tail = Tensor::empty(arena, Shape(dims), info.dtype);
      reader.read_rows(info.name, rows / 2, rows, tail);
    }
  }
}
