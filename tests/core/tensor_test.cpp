#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>

namespace lattice {
namespace {

TEST(Tensor, AllocatesFromTheArenaAndReturnsOnDestruction) {
  Arena arena("test");
  {
    Tensor t = Tensor::zeros(arena, {4, 8}, DType::kF32, MemoryCategory::kParameters);
    EXPECT_EQ(t.numel(), 32);
    EXPECT_EQ(t.nbytes(), 128u);
    EXPECT_EQ(arena.stats().live_by_category[size_t(MemoryCategory::kParameters)], 128u);
    Tensor alias = t;  // shares storage
    EXPECT_EQ(alias.data<float>(), t.data<float>());
    for (int i = 0; i < 32; ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
  }
  EXPECT_EQ(arena.stats().live_bytes, 0u);
}

TEST(Tensor, ViewsAndRowSlicesShareStorage) {
  Arena arena("test");
  Tensor t = Tensor::empty(arena, {3, 4}, DType::kF32);
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = float(i);
  Tensor rows = t.slice_rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 4}));
  EXPECT_EQ(rows.data<float>()[0], 4.0f);
  Tensor flat = t.view({12});
  EXPECT_EQ(flat.data<float>()[11], 11.0f);
  EXPECT_THROW(t.view({5}), ShapeError);
  EXPECT_THROW(t.slice_rows(2, 4), ShapeError);
}

TEST(Tensor, BorrowedStorageIsNotReturnedToAnArena) {
  float buffer[6] = {1, 2, 3, 4, 5, 6};
  Tensor t = Tensor::borrow(buffer, {2, 3}, DType::kF32);
  EXPECT_TRUE(t.is_borrowed());
  EXPECT_EQ(t.data<float>()[5], 6.0f);
  EXPECT_THROW(Tensor::borrow(nullptr, {2}, DType::kF32), ValueError);
}

TEST(Tensor, WrongDtypeAccessAndUndefinedTensorsRaiseClearErrors) {
  Arena arena("test");
  Tensor t = Tensor::empty(arena, {2}, DType::kBF16);
  EXPECT_THROW(t.data<float>(), DTypeError);
  try {
    t.data<float>();
  } catch (const DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("bf16[2]"), std::string::npos) << e.what();
  }
  Tensor undefined;
  EXPECT_THROW(undefined.raw_data(), ValueError);
  EXPECT_THROW(expect_defined(undefined, "op", "x"), ValueError);
  Tensor a = Tensor::empty(arena, {2, 3}, DType::kF32);
  try {
    expect_shape(a, {3, 2}, "layernorm_forward", "weight");
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "layernorm_forward: 'weight' has shape [2, 3], expected [3, 2]");
  }
}

TEST(Tensor, CopyFromConvertsBetweenFloatTypes) {
  Arena arena("test");
  Tensor f = Tensor::empty(arena, {4}, DType::kF32);
  float values[4] = {1.0f, -2.5f, 3.140625f, 65504.0f};
  for (int i = 0; i < 4; ++i) f.data<float>()[i] = values[i];
  Tensor b = Tensor::empty(arena, {4}, DType::kBF16);
  b.copy_from(f);
  Tensor h = Tensor::empty(arena, {4}, DType::kF16);
  h.copy_from(f);
  Tensor back = Tensor::empty(arena, {4}, DType::kF32);
  back.copy_from(h);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back.data<float>()[i], values[i]);
  EXPECT_EQ(float(b.data<bf16>()[2]), 3.140625f);
  Tensor wrong = Tensor::empty(arena, {5}, DType::kF32);
  EXPECT_THROW(wrong.copy_from(f), ShapeError);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16(1.00390625f).bits, 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even).
  EXPECT_EQ(bf16(1.01171875f).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(float(bf16(NAN))));
  EXPECT_TRUE(std::isinf(float(bf16(INFINITY))));
}

TEST(DType, Fp16RoundTripsEveryHalfValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t bits = uint16_t(h);
    float f = fp16::to_float(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp16::from_float(f), bits) << std::hex << h;
  }
  EXPECT_EQ(fp16::from_float(1e6f), 0x7c00);      // overflow to inf
  EXPECT_EQ(fp16::from_float(1e-9f), 0x0000);     // underflow to zero
  EXPECT_EQ(fp16::from_float(65519.0f), 0x7bff);  // below the rounding boundary
  EXPECT_EQ(fp16::from_float(65520.0f), 0x7c00);
}

TEST(Error, ChecksReportOperandsAndLocation) {
  try {
    LATTICE_CHECK_EQ(2 + 2, 5, "arithmetic for {}", "testing");
    FAIL();
  } catch (const ContractError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("tensor_test.cpp"), std::string::npos) << what;
    EXPECT_NE(what.find("left: 4, right: 5"), std::string::npos) << what;
    EXPECT_NE(what.find("arithmetic for testing"), std::string::npos) << what;
  }
  EXPECT_THROW(LATTICE_CHECK(false), ContractError);
}

}  // namespace
}  // namespace lattice
