#include "comm/launch_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.h"

namespace lattice {
namespace {

EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(LaunchEnv, ReadsEachLauncher) {
  auto ompi = detect_launch_environment(fake_env({{"OMPI_COMM_WORLD_RANK", "3"},
                                                  {"OMPI_COMM_WORLD_SIZE", "8"},
                                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  ASSERT_TRUE(ompi.has_value());
  EXPECT_EQ(ompi->launcher, "openmpi");
  EXPECT_EQ(ompi->rank, 3);
  EXPECT_EQ(ompi->size, 8);
  EXPECT_EQ(ompi->local_rank, 1);
  auto pmi = detect_launch_environment(fake_env({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}));
  ASSERT_TRUE(pmi.has_value());
  EXPECT_EQ(pmi->launcher, "pmi");
  auto slurm = detect_launch_environment(
      fake_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "2"}}));
  ASSERT_TRUE(slurm.has_value());
  EXPECT_EQ(slurm->launcher, "slurm");
  EXPECT_EQ(slurm->local_rank, 2);
  EXPECT_FALSE(detect_launch_environment(fake_env({})).has_value());
}

TEST(LaunchEnv, RefusesMalformedVariables) {
  EXPECT_THROW(detect_launch_environment(fake_env({{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}})),
               ConfigError);
  EXPECT_THROW(detect_launch_environment(fake_env({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}})),
               ConfigError);
}

}  // namespace
}  // namespace lattice
