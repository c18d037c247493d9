#include "plan/calibration.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "plan/cluster_profile.h"
#include "support/scratch_dir.h"

namespace lattice::plan {
namespace {

MachineMeasurement two_core_machine() {
  MachineMeasurement m;
  m.name = "lab-cpu";
  m.device_name = "cpu test";
  m.ranks_per_node = 2;
  m.memory_bytes = 8e9;
  m.memory_bytes_per_s = 20e9;
  m.gemm = {{.precision = Precision::kBf16, .m = 512, .n = 512, .k = 512, .flops_per_s = 50e9},
            {.precision = Precision::kBf16, .m = 2048, .n = 2048, .k = 2048, .flops_per_s = 200e9},
            {.precision = Precision::kFp32, .m = 2048, .n = 2048, .k = 2048, .flops_per_s = 80e9}};
  m.collectives = {
      {.op = CollectiveOp::kAllReduce, .group_size = 2, .alpha_s = 8e-6, .bus_bytes_per_s = 6e9},
      {.op = CollectiveOp::kAllGather, .group_size = 2, .alpha_s = 5e-6, .bus_bytes_per_s = 7e9}};
  return m;
}

TEST(Calibration, PeaksAreTheBestGemmAndEfficienciesAreRelativeToThem) {
  const ClusterSpec c = calibrated_cluster(two_core_machine());
  EXPECT_EQ(c.device.peak_flops_bf16, 200e9);
  EXPECT_EQ(c.device.peak_flops_fp32, 80e9);
  ASSERT_EQ(c.gemm.size(), 3u);
  EXPECT_DOUBLE_EQ(c.gemm[0].efficiency, 0.25);
  EXPECT_DOUBLE_EQ(c.gemm[1].efficiency, 1.0);
  EXPECT_DOUBLE_EQ(c.gemm[2].efficiency, 1.0);
  // A measured shape is answered by its own measurement.
  EXPECT_NEAR(gemm_efficiency(c, Precision::kBf16, 512, 512, 512), 0.25, 1e-12);
  EXPECT_EQ(c.gpus_per_node, 2);
}

TEST(Calibration, TheLinkComesFromTheAllReduce) {
  const ClusterSpec c = calibrated_cluster(two_core_machine());
  EXPECT_EQ(c.intra_node.peak_bytes_per_s, 6e9);
  EXPECT_DOUBLE_EQ(c.intra_node.alpha_s, 8e-6 / 2);  // 2(n-1) ring steps for n = 2
  EXPECT_EQ(c.inter_node.peak_bytes_per_s, 6e9);
  ASSERT_EQ(c.collectives.size(), 2u);
  EXPECT_EQ(c.collectives[1].op, CollectiveOp::kAllGather);
  EXPECT_EQ(c.collectives[1].transport, Transport::kIntraNode);
}

TEST(Calibration, WrittenProfileLoadsBackEqual) {
  const ClusterSpec c = calibrated_cluster(two_core_machine());
  const std::string path = (testing::scratch_dir("calibration") / "profile.json").string();
  save_cluster_profile(c, path);
  const ClusterSpec back = load_cluster_profile(path);
  std::filesystem::remove(path);
  EXPECT_EQ(back.name, "lab-cpu");
  EXPECT_EQ(back.gpus_per_node, 2);
  EXPECT_EQ(back.device.peak_flops_bf16, c.device.peak_flops_bf16);
  EXPECT_EQ(back.device.hbm_bytes_per_s, 20e9);
  EXPECT_EQ(back.device.max_gemm_efficiency, 1.0);
  ASSERT_EQ(back.gemm.size(), c.gemm.size());
  for (size_t i = 0; i < c.gemm.size(); ++i) {
    EXPECT_EQ(back.gemm[i].m, c.gemm[i].m);
    EXPECT_EQ(back.gemm[i].efficiency, c.gemm[i].efficiency);
    EXPECT_EQ(back.gemm[i].precision, c.gemm[i].precision);
  }
  ASSERT_EQ(back.collectives.size(), 2u);
  EXPECT_EQ(back.collectives[0].alpha_s, 8e-6);
  EXPECT_EQ(back.collectives[0].bus_bytes_per_s, 6e9);
  EXPECT_EQ(back.intra_node.alpha_s, c.intra_node.alpha_s);
  EXPECT_EQ(back.inter_node.name, c.inter_node.name);
}

TEST(Calibration, RefusesMissingMeasurements) {
  MachineMeasurement m = two_core_machine();
  m.gemm.clear();
  EXPECT_THROW(calibrated_cluster(m), ConfigError);
  m = two_core_machine();
  m.collectives[0].group_size = 1;
  EXPECT_THROW(calibrated_cluster(m), ConfigError);
}

TEST(Calibration, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::kReduceScatter, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::kSendRecv, 8), 1.0);
}

}  // namespace
}  // namespace lattice::plan
