#include "plan/cluster_profile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "support/scratch_dir.h"

namespace lattice::plan {
namespace {

ClusterSpec calibrated() {
  ClusterSpec c = cluster_preset("dgx-h100");
  c.name = "lab";
  c.gemm.push_back(
      {.precision = Precision::kBf16, .m = 4096, .n = 4096, .k = 4096, .efficiency = 0.71});
  c.gemm.push_back(
      {.precision = Precision::kFp32, .m = 512, .n = 512, .k = 512, .efficiency = 0.4});
  c.collectives.push_back({.transport = Transport::kInterNode,
                           .op = CollectiveOp::kAllReduce,
                           .group_size = 16,
                           .alpha_s = 3.5e-5,
                           .bus_bytes_per_s = 41e9});
  c.runtime.dp_overlap = 0.6;
  c.power = {.busy_watts = 650, .waiting_watts = 200, .node_other_watts = 3000, .pue = 1.3};
  c.price = {.per_device_hour = 2.25, .per_kwh = 0.08};
  return c;
}

TEST(ClusterProfile, WriteThenParseGivesTheSameCluster) {
  const ClusterSpec c = calibrated();
  const ClusterSpec back = parse_cluster_profile(write_cluster_profile(c), "lab.json");
  EXPECT_EQ(back.name, "lab");
  EXPECT_EQ(back.gpus_per_node, c.gpus_per_node);
  EXPECT_EQ(back.device.memory_bytes, c.device.memory_bytes);
  EXPECT_EQ(back.device.peak_flops_bf16, c.device.peak_flops_bf16);
  EXPECT_EQ(back.inter_node.peak_bytes_per_s, c.inter_node.peak_bytes_per_s);
  ASSERT_EQ(back.gemm.size(), 2u);
  EXPECT_EQ(back.gemm[1].precision, Precision::kFp32);
  EXPECT_EQ(back.gemm[0].efficiency, 0.71);
  ASSERT_EQ(back.collectives.size(), 1u);
  EXPECT_EQ(back.collectives[0].transport, Transport::kInterNode);
  EXPECT_EQ(back.collectives[0].group_size, 16);
  EXPECT_EQ(back.collectives[0].bus_bytes_per_s, 41e9);
  EXPECT_EQ(back.runtime.dp_overlap, 0.6);
  EXPECT_EQ(back.power.busy_watts, c.power.busy_watts);
  EXPECT_EQ(back.power.pue, 1.3);
  EXPECT_EQ(back.price.per_device_hour, 2.25);
  EXPECT_EQ(write_cluster_profile(back), write_cluster_profile(c));
}

TEST(ClusterProfile, BaseProvidesWhatTheProfileLeavesOut) {
  const ClusterSpec c = parse_cluster_profile(R"({"format": "lattice-cluster-profile",
      "version": 1, "base": "dgx-a100", "links": {"inter_node": {"peak_bytes_per_s": 50e9}},
      "gemm": [{"precision": "bf16", "m": 1024, "n": 1024, "k": 1024, "efficiency": 0.5}]})",
                                              "a100-ndr.json");
  EXPECT_EQ(c.name, "a100-ndr");
  EXPECT_EQ(c.device.peak_flops_bf16, 312e12);
  EXPECT_EQ(c.inter_node.peak_bytes_per_s, 50e9);
  EXPECT_EQ(c.inter_node.alpha_s, cluster_preset("dgx-a100").inter_node.alpha_s);
  EXPECT_DOUBLE_EQ(gemm_efficiency(c, Precision::kBf16, 1024, 1024, 1024), 0.5);
}

TEST(ClusterProfile, MalformedProfilesNameTheProblem) {
  auto message = [](const std::string& text) {
    try {
      parse_cluster_profile(text, "p.json");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{").find("not a JSON object"), std::string::npos);
  // A field of the wrong type is named with the type expected and the one found, at any depth.
  const std::string typed = message(
      R"({"format": "lattice-cluster-profile", "version": 1, "base": "dgx-h100", "gpus_per_node": "8"})");
  EXPECT_NE(typed.find("p.json: 'gpus_per_node' is a string (\"8\"), expected an integer"),
            std::string::npos)
      << typed;
  const std::string nested = message(
      R"({"format": "lattice-cluster-profile", "version": 1, "base": "dgx-h100",
          "gemm": [{"precision": "bf16", "m": 8, "n": 8, "k": 8, "efficiency": 0.5},
                   {"precision": "bf16", "m": 8, "n": "8", "k": 8, "efficiency": 0.5}]})");
  EXPECT_NE(nested.find("'gemm[1].n' is a string (\"8\"), expected an integer"), std::string::npos)
      << nested;
  const std::string link = message(
      R"({"format": "lattice-cluster-profile", "version": 1, "base": "dgx-h100",
          "links": {"inter_node": {"alpha_s": true}}})");
  EXPECT_NE(link.find("'links.inter_node.alpha_s' is a boolean (true), expected a number"),
            std::string::npos)
      << link;
  EXPECT_NE(message(R"({"format": "other"})").find("format"), std::string::npos);
  EXPECT_NE(message(R"({"format": "lattice-cluster-profile", "version": 9})").find("version"),
            std::string::npos);
  EXPECT_NE(message(R"({"format": "lattice-cluster-profile", "version": 1})").find("gpus_per_node"),
            std::string::npos);
  EXPECT_NE(message(R"({"format": "lattice-cluster-profile", "version": 1, "base": "dgx-h100",
                        "gemm": [{"precision": "bf16", "m": 8}]})")
                .find("gemm"),
            std::string::npos);
  EXPECT_NE(message(R"({"format": "lattice-cluster-profile", "version": 1, "base": "dgx-h100",
                        "collectives": [{"transport": "pcie", "op": "all_reduce",
                        "group_size": 2, "alpha_s": 1e-5, "bus_bytes_per_s": 1e10}]})")
                .find("pcie"),
            std::string::npos);
  EXPECT_NE(message(R"({"format": "lattice-cluster-profile", "version": 1, "base": "dgx-h100",
                        "power": {"pue": 0.5}})")
                .find("pue is at least 1"),
            std::string::npos);
  EXPECT_NE(message(R"({"format": "lattice-cluster-profile", "version": 1, "base": "dgx-h100",
                        "device": {"memory_bytes": "lots"}})")
                .find("memory_bytes"),
            std::string::npos);
}

TEST(ClusterProfile, SaveIsReadBackByResolve) {
  const std::string path = (testing::scratch_dir("cluster_profile") / "profile.json").string();
  save_cluster_profile(calibrated(), path);
  const ClusterSpec c = resolve_cluster(path);
  std::filesystem::remove(path);
  EXPECT_EQ(c.name, "lab");
  EXPECT_EQ(c.gemm.size(), 2u);
  EXPECT_THROW(load_cluster_profile(path), IoError);
  EXPECT_THROW(resolve_cluster("dgx-b200"), ConfigError);
}

}  // namespace
}  // namespace lattice::plan

namespace lattice::plan {
namespace {

TEST(ClusterProfile, PresetFilesInConfigsMatchTheBuiltInPresets) {
  for (const std::string& name : cluster_preset_names()) {
    const std::string path =
        std::string(LATTICE_SOURCE_DIR) + "/configs/clusters/" + name + ".json";
    EXPECT_EQ(write_cluster_profile(load_cluster_profile(path)),
              write_cluster_profile(cluster_preset(name)))
        << path << " is out of date: regenerate it with write_cluster_profile";
  }
}

}  // namespace
}  // namespace lattice::plan
