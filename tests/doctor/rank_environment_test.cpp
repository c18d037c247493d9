// `lattice doctor --env`'s checks on described jobs: each condition (ranks sharing cores, fewer
// cores than the thread budget, a rank across NUMA nodes, a launcher's rank that is not
// Lattice's, local ranks given twice, one device for two ranks) names its check.
#include <gtest/gtest.h>

#include "doctor/rank_environment.h"

namespace lattice::doctor {
namespace {

// `n` ranks on one host, bound one core each, launched by OpenMPI.
std::vector<RankEnvironment> bound_job(int n) {
  std::vector<RankEnvironment> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.push_back({.rank = r,
                     .world = n,
                     .host = "node0",
                     .launcher = LaunchEnvironment{"openmpi", r, n, r},
                     .cpus = {r},
                     .numa_nodes_spanned = 1,
                     .threads = 1,
                     .omp_num_threads = std::nullopt,
                     .cuda_visible_devices = std::nullopt,
                     .visible_gpus = -1});
  }
  return ranks;
}

const CheckResult& of(const std::vector<CheckResult>& results, const std::string& id) {
  for (const CheckResult& r : results)
    if (r.id == id) return r;
  throw std::runtime_error("no check " + id);
}

TEST(RankEnvironment, ABoundJobPasses) {
  const std::vector<CheckResult> results = check_rank_environments(bound_job(4));
  EXPECT_EQ(of(results, "launcher").verdict, Verdict::kPass);
  EXPECT_EQ(of(results, "affinity").verdict, Verdict::kPass);
  EXPECT_EQ(of(results, "devices").verdict, Verdict::kNotApplicable);
}

TEST(RankEnvironment, RanksSharingCoresFailAffinityNamingThemAndTheCores) {
  std::vector<RankEnvironment> job = bound_job(3);
  job[2].cpus = {0, 1, 2};  // unbound: every core of the host
  const CheckResult r = of(check_rank_environments(job), "affinity");
  EXPECT_EQ(r.verdict, Verdict::kFail);
  EXPECT_NE(r.saw.find("ranks 0 and 2 on node0 share cores 0"), std::string::npos) << r.saw;
  EXPECT_NE(r.fix.find("--bind-to core"), std::string::npos);
}

TEST(RankEnvironment, FewerCoresThanThreadsOrTwoNumaNodesWarnAffinity) {
  std::vector<RankEnvironment> job = bound_job(2);
  job[1].threads = 4;
  EXPECT_EQ(of(check_rank_environments(job), "affinity").verdict, Verdict::kWarn);
  job[1].threads = 1;
  job[1].numa_nodes_spanned = 2;
  const CheckResult r = of(check_rank_environments(job), "affinity");
  EXPECT_EQ(r.verdict, Verdict::kWarn);
  EXPECT_NE(r.saw.find("span 2 NUMA nodes"), std::string::npos) << r.saw;
}

TEST(RankEnvironment, ALauncherRankThatIsNotLatticesOrATwiceGivenLocalRankFailsLauncher) {
  std::vector<RankEnvironment> job = bound_job(2);
  job[1].launcher->rank = 0;
  CheckResult r = of(check_rank_environments(job), "launcher");
  EXPECT_EQ(r.verdict, Verdict::kFail);
  EXPECT_NE(r.saw.find("rank 1 of 2 is rank 0 of 2 to its launcher"), std::string::npos) << r.saw;
  job = bound_job(2);
  job[1].launcher->local_rank = 0;
  r = of(check_rank_environments(job), "launcher");
  EXPECT_EQ(r.verdict, Verdict::kFail);
  EXPECT_NE(r.saw.find("local ranks 0, 0"), std::string::npos) << r.saw;
}

TEST(RankEnvironment, OneDeviceForTwoRanksOfAHostFailsDevices) {
  std::vector<RankEnvironment> job = bound_job(2);
  job[0].cuda_visible_devices.emplace(1, '0');
  job[1].cuda_visible_devices.emplace(1, '0');
  EXPECT_EQ(of(check_rank_environments(job), "devices").verdict, Verdict::kFail);
  job[1].cuda_visible_devices.emplace(1, '1');
  EXPECT_EQ(of(check_rank_environments(job), "devices").verdict, Verdict::kPass);
}

TEST(RankEnvironment, TravelsAsJson) {
  RankEnvironment e = bound_job(2)[1];
  e.omp_num_threads.emplace(1, '4');
  const RankEnvironment back = rank_environment_from_json(to_json(e));
  EXPECT_EQ(back.rank, 1);
  EXPECT_EQ(back.launcher->local_rank, 1);
  EXPECT_EQ(back.cpus, std::vector<int>{1});
  EXPECT_EQ(back.omp_num_threads, "4");
  EXPECT_FALSE(back.cuda_visible_devices);
}

}  // namespace
}  // namespace lattice::doctor
