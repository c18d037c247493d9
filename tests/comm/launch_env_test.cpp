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

TEST(LaunchEnv, ReadsLatticeLaunchVariables) {
  auto env = detect_gloo_environment(fake_env({{"LATTICE_RANK", "2"},
                                               {"LATTICE_WORLD_SIZE", "4"},
                                               {"LATTICE_LOCAL_RANK", "1"},
                                               {"LATTICE_STORE", "/tmp/job/store"},
                                               {"LATTICE_GENERATION", "3"}}));
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 2);
  EXPECT_EQ(env->size, 4);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->store, "/tmp/job/store");
  EXPECT_EQ(env->generation, 3);
  EXPECT_EQ(env->prefix(), "gen3/");
  EXPECT_EQ(env->bind_addr, "127.0.0.1");
  auto bound = detect_gloo_environment(fake_env({{"LATTICE_RANK", "0"},
                                                 {"LATTICE_WORLD_SIZE", "1"},
                                                 {"LATTICE_STORE", "/s"},
                                                 {"LATTICE_GENERATION", "0"},
                                                 {"LATTICE_BIND_ADDR", "10.0.0.7"}}));
  ASSERT_TRUE(bound.has_value());
  EXPECT_EQ(bound->bind_addr, "10.0.0.7");
  EXPECT_EQ(bound->local_rank, 0);
  EXPECT_FALSE(detect_gloo_environment(fake_env({{"OMPI_COMM_WORLD_RANK", "0"}})).has_value());
}

TEST(LaunchEnv, RefusesHalfSetOrMalformedLatticeLaunchVariables) {
  try {
    detect_gloo_environment(fake_env({{"LATTICE_RANK", "0"}, {"LATTICE_WORLD_SIZE", "2"}}));
    FAIL() << "accepted a launch without a store";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("LATTICE_STORE, LATTICE_GENERATION not"),
              std::string::npos)
        << e.what();
  }
  const std::map<std::string, std::string> good = {{"LATTICE_RANK", "0"},
                                                   {"LATTICE_WORLD_SIZE", "2"},
                                                   {"LATTICE_STORE", "/s"},
                                                   {"LATTICE_GENERATION", "0"}};
  for (const auto& [name, bad] : std::map<std::string, std::string>{{"LATTICE_RANK", "2"},
                                                                    {"LATTICE_WORLD_SIZE", "x"},
                                                                    {"LATTICE_GENERATION", "-1"},
                                                                    {"LATTICE_STORE", ""}}) {
    auto vars = good;
    vars[name] = bad;
    EXPECT_THROW(detect_gloo_environment(fake_env(vars)), ConfigError) << name << "=" << bad;
  }
}

}  // namespace
}  // namespace lattice
