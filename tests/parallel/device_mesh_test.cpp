// The device mesh: coordinates follow rank = (pp·dp_size + dp)·tp_size + tp for every rank of
// several shapes, each group holds exactly the ranks that formula gives and its collectives
// work, layouts that do not fit the world are refused with a message naming the fix, and the
// embedding group joins the first and last stage.
#include "parallel/device_mesh.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "comm/thread_world.h"
#include "core/error.h"

namespace lattice {
namespace {

const MeshShape kShapes[] = {{2, 2, 2}, {1, 4, 2}, {4, 1, 1}, {3, 1, 2}, {1, 1, 1}, {2, 3, 1}};

// The world ranks along one axis through `at`, in the axis' coordinate order, straight from the
// formula rather than from mesh_rank.
std::vector<int> ranks_along(const MeshShape& s, const MeshCoordinates& at, char axis) {
  std::vector<int> ranks;
  const int n = axis == 't' ? s.tp : axis == 'd' ? s.dp : s.pp;
  for (int i = 0; i < n; ++i) {
    const int pp = axis == 'p' ? i : at.pp;
    const int dp = axis == 'd' ? i : at.dp;
    const int tp = axis == 't' ? i : at.tp;
    ranks.push_back((pp * s.dp + dp) * s.tp + tp);
  }
  return ranks;
}

// A wrongly built group fails the test in seconds instead of at the 30 s default deadline.
ThreadWorldOptions fail_fast() {
  ThreadWorldOptions options;
  options.config.timeout = std::chrono::seconds(10);
  return options;
}

float sum_of(const std::vector<int>& ranks) {
  return float(std::accumulate(ranks.begin(), ranks.end(), 0));
}

TEST(MeshCoordinates, TpFastestThenDpThenPpForEveryRank) {
  for (const MeshShape& s : kShapes) {
    int rank = 0;  // counts up in mesh order: pp outermost, tp innermost
    for (int pp = 0; pp < s.pp; ++pp) {
      for (int dp = 0; dp < s.dp; ++dp) {
        for (int tp = 0; tp < s.tp; ++tp, ++rank) {
          const MeshCoordinates expected{pp, dp, tp};
          EXPECT_EQ(mesh_coordinates(s, rank), expected) << s.to_string() << " rank " << rank;
          EXPECT_EQ(mesh_rank(s, expected), rank) << s.to_string() << " " << expected.to_string();
        }
      }
    }
    EXPECT_EQ(rank, s.world_size());
  }
}

TEST(MeshCoordinates, WorkedExample) {
  const MeshShape s{2, 2, 2};
  EXPECT_EQ(mesh_coordinates(s, 5), (MeshCoordinates{1, 0, 1}));
  EXPECT_EQ(mesh_coordinates(s, 6), (MeshCoordinates{1, 1, 0}));
  EXPECT_EQ(mesh_rank(MeshShape{3, 1, 2}, {2, 0, 1}), 5);
  EXPECT_EQ(s.to_string(), "pp2·dp2·tp2");
  EXPECT_EQ((MeshShape{1, 2, 2}).to_string(), "pp1·dp2·tp2");
  EXPECT_EQ((MeshShape{3, 1, 2}).world_size(), 6);
}

TEST(MeshCoordinates, RefusesRanksAndCoordinatesOutsideTheMesh) {
  const MeshShape s{2, 2, 2};
  EXPECT_THROW(mesh_coordinates(s, 8), ValueError);
  EXPECT_THROW(mesh_coordinates(s, -1), ValueError);
  EXPECT_THROW(mesh_rank(s, {2, 0, 0}), ValueError);
  EXPECT_THROW(mesh_rank(s, {0, 0, -1}), ValueError);
  EXPECT_THROW(mesh_coordinates(MeshShape{1, 0, 2}, 0), ConfigError);
}

TEST(ValidateMesh, AcceptsLayoutsWhoseProductIsTheWorld) {
  EXPECT_NO_THROW(validate_mesh({2, 2, 2}, 8));
  EXPECT_NO_THROW(validate_mesh({1, 1, 1}, 1));
  EXPECT_NO_THROW(validate_mesh({3, 1, 2}, 6));
}

TEST(ValidateMesh, ProductMismatchNamesTheNumbersAndTheFix) {
  try {
    validate_mesh({2, 2, 2}, 6);
    FAIL() << "accepted pp2·dp2·tp2 on 6 ranks";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("pp2·dp2·tp2"), std::string::npos) << what;
    EXPECT_NE(what.find("= 8 ranks"), std::string::npos) << what;
    EXPECT_NE(what.find("the world has 6"), std::string::npos) << what;
    EXPECT_NE(what.find("mpirun -np 8"), std::string::npos) << what;
    EXPECT_NE(what.find("product is 6"), std::string::npos) << what;
  }
}

TEST(ValidateMesh, AxisBelowOneNamesTheAxis) {
  try {
    validate_mesh({1, 0, 4}, 4);
    FAIL() << "accepted dp = 0";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("dp is 0"), std::string::npos) << what;
    EXPECT_NE(what.find("--dp"), std::string::npos) << what;
  }
  // A negative axis must not slip through as a product that happens to match (-1·-2·2 = 4).
  EXPECT_THROW(validate_mesh({-1, -2, 2}, 4), ConfigError);
  EXPECT_THROW(validate_mesh({1, 1, -3}, 1), ConfigError);
}

TEST(DeviceMesh, GroupsHoldTheFormulaRanksAndReduce) {
  for (const MeshShape& s : kShapes) {
    SCOPED_TRACE(s.to_string());
    std::atomic<int> ranks_checked{0};
    run_ranks(
        s.world_size(),
        [&](Communicator& world) {
          DeviceMesh mesh(world, s);
          const MeshCoordinates at = mesh.coordinates();
          EXPECT_EQ(mesh.shape(), s);
          EXPECT_EQ(at, mesh_coordinates(s, world.rank()));
          EXPECT_EQ(&mesh.world(), &world);

          const std::vector<int> tp = ranks_along(s, at, 't');
          const std::vector<int> dp = ranks_along(s, at, 'd');
          const std::vector<int> pp = ranks_along(s, at, 'p');
          EXPECT_EQ(mesh.tp().world_ranks(), tp);
          EXPECT_EQ(mesh.dp().world_ranks(), dp);
          EXPECT_EQ(mesh.pp().world_ranks(), pp);
          EXPECT_EQ(mesh.tp().rank(), at.tp);
          EXPECT_EQ(mesh.dp().rank(), at.dp);
          EXPECT_EQ(mesh.pp().rank(), at.pp);

          // Working collectives: the sum of world ranks over each group, then the world still
          // works.
          float x = float(world.rank());
          mesh.tp().all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
          EXPECT_EQ(x, sum_of(tp));
          x = float(world.rank());
          mesh.dp().all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
          EXPECT_EQ(x, sum_of(dp));
          x = float(world.rank());
          mesh.pp().all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
          EXPECT_EQ(x, sum_of(pp));
          float one = 1;
          world.all_reduce(&one, 1, DType::kF32, ReduceOp::kSum);
          EXPECT_EQ(one, float(s.world_size()));
          ++ranks_checked;
        },
        fail_fast());
    EXPECT_EQ(ranks_checked.load(), s.world_size());
  }
}

TEST(DeviceMesh, GroupsAreNamedForTheirAxisAndPosition) {
  run_ranks(
      8,
      [](Communicator& world) {
        DeviceMesh mesh(world, {2, 2, 2});
        const MeshCoordinates at = mesh.coordinates();
        EXPECT_EQ(mesh.tp().name(),
                  "tp[pp" + std::to_string(at.pp) + "·dp" + std::to_string(at.dp) + "]");
        EXPECT_EQ(mesh.dp().name(),
                  "dp[pp" + std::to_string(at.pp) + "·tp" + std::to_string(at.tp) + "]");
        EXPECT_EQ(mesh.pp().name(),
                  "pp[dp" + std::to_string(at.dp) + "·tp" + std::to_string(at.tp) + "]");
        ASSERT_NE(mesh.embedding(), nullptr);
        EXPECT_EQ(mesh.embedding()->name(),
                  "embedding[dp" + std::to_string(at.dp) + "·tp" + std::to_string(at.tp) + "]");
      },
      fail_fast());
}

TEST(DeviceMesh, TimeoutInAGroupQuotesItsName) {
  run_ranks(
      2,
      [](Communicator& world) {
        DeviceMesh mesh(world, {1, 1, 2});
        if (world.rank() == 0) {  // rank 1 skips the all_reduce
          CollectiveOptions options;
          options.timeout = std::chrono::milliseconds(200);
          float x = 1;
          try {
            mesh.tp().all_reduce(&x, 1, DType::kF32, ReduceOp::kSum, options);
            ADD_FAILURE() << "all_reduce completed without rank 1";
          } catch (const TimeoutError& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("group 'tp[pp0·dp0]'"), std::string::npos) << what;
          }
        }
        world.barrier();
      },
      fail_fast());
}

TEST(DeviceMesh, EmbeddingGroupJoinsFirstAndLastStage) {
  const MeshShape s{4, 1, 2};
  std::atomic<int> members{0};
  run_ranks(
      s.world_size(),
      [&](Communicator& world) {
        DeviceMesh mesh(world, s);
        const MeshCoordinates at = mesh.coordinates();
        EXPECT_EQ(mesh.is_first_stage(), at.pp == 0);
        EXPECT_EQ(mesh.is_last_stage(), at.pp == 3);
        Communicator* embedding = mesh.embedding();
        if (at.pp == 1 || at.pp == 2) {
          EXPECT_EQ(embedding, nullptr) << "middle stage " << at.to_string();
          return;
        }
        ASSERT_NE(embedding, nullptr) << at.to_string();
        ++members;
        const std::vector<int> expected{mesh_rank(s, {0, at.dp, at.tp}),
                                        mesh_rank(s, {3, at.dp, at.tp})};
        EXPECT_EQ(embedding->world_ranks(), expected);
        EXPECT_EQ(embedding->rank(), at.pp == 0 ? 0 : 1);
        float x = float(world.rank());
        embedding->all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
        EXPECT_EQ(x, sum_of(expected));
      },
      fail_fast());
  EXPECT_EQ(members.load(), 4);  // first and last stage of both tp ranks
}

TEST(DeviceMesh, EmbeddingGroupWithOneOrTwoStages) {
  run_ranks(
      2,
      [](Communicator& world) {  // pp1·dp2·tp1: every rank is first and last stage
        DeviceMesh mesh(world, {1, 2, 1});
        EXPECT_TRUE(mesh.is_first_stage());
        EXPECT_TRUE(mesh.is_last_stage());
        ASSERT_NE(mesh.embedding(), nullptr);
        EXPECT_EQ(mesh.embedding()->world_ranks(), std::vector<int>{world.rank()});
        float x = 5;
        mesh.embedding()->all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
        EXPECT_EQ(x, 5);
      },
      fail_fast());
  run_ranks(
      4,
      [](Communicator& world) {  // pp2·dp1·tp2: both stages, pairs {0,2} and {1,3}
        DeviceMesh mesh(world, {2, 1, 2});
        ASSERT_NE(mesh.embedding(), nullptr);
        const int tp = world.rank() % 2;
        EXPECT_EQ(mesh.embedding()->world_ranks(), (std::vector<int>{tp, tp + 2}));
        EXPECT_NE(mesh.is_first_stage(), mesh.is_last_stage());
      },
      fail_fast());
}

TEST(DeviceMesh, RefusesALayoutThatDoesNotFitTheWorldOnEveryRank) {
  std::atomic<int> refused{0};
  run_ranks(
      4,
      [&](Communicator& world) {
        try {
          DeviceMesh mesh(world, {2, 2, 2});
          ADD_FAILURE() << "built pp2·dp2·tp2 on 4 ranks";
        } catch (const ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("mpirun -np 8"), std::string::npos) << e.what();
          ++refused;
        }
        world.barrier();  // refused before any collective: the world is still in step
      },
      fail_fast());
  EXPECT_EQ(refused.load(), 4);
}

}  // namespace
}  // namespace lattice

namespace lattice {
namespace {

// Context parallelism sits between tp and dp: rank = ((pp·dp + dp)·cp + cp)·tp + tp. The cp
// group strides by tp, the dp group by cp·tp, and the replicas (dp × cp) are every rank of the
// same (pp, tp), ranked dp·cp + cp.
TEST(DeviceMesh, ContextParallelSitsBetweenTensorAndDataParallel) {
  const MeshShape s{.pp = 1, .dp = 2, .tp = 2, .cp = 2};
  EXPECT_EQ(s.world_size(), 8);
  EXPECT_EQ(s.to_string(), "pp1·dp2·cp2·tp2");
  EXPECT_EQ(mesh_coordinates(s, 6), (MeshCoordinates{.pp = 0, .dp = 1, .tp = 0, .cp = 1}));
  EXPECT_EQ(mesh_rank(s, {.pp = 0, .dp = 1, .tp = 1, .cp = 0}), 5);
  std::vector<std::vector<int>> cp(8), dp(8), replicas(8), tp(8);
  std::vector<std::string> names(8);
  std::mutex mutex;
  run_ranks(8, [&](Communicator& world) {
    DeviceMesh mesh(world, s);
    ASSERT_NE(mesh.cp(), nullptr);
    std::lock_guard lock(mutex);
    const size_t r = size_t(world.rank());
    cp[r] = mesh.cp()->world_ranks();
    dp[r] = mesh.dp().world_ranks();
    replicas[r] = mesh.replicas().world_ranks();
    tp[r] = mesh.tp().world_ranks();
    names[r] = mesh.cp()->name() + " " + mesh.replicas().name() + " " + mesh.dp().name();
  });
  EXPECT_EQ(cp[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(cp[5], (std::vector<int>{5, 7}));
  EXPECT_EQ(dp[0], (std::vector<int>{0, 4}));
  EXPECT_EQ(dp[3], (std::vector<int>{3, 7}));
  EXPECT_EQ(tp[6], (std::vector<int>{6, 7}));
  EXPECT_EQ(replicas[0], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(replicas[7], (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(names[6], "cp[pp0·dp1·tp0] dp·cp[pp0·tp0] dp[pp0·tp0·cp1]");
}

TEST(DeviceMesh, WithoutContextParallelismTheReplicasAreTheDpGroup) {
  run_ranks(4, [&](Communicator& world) {
    DeviceMesh mesh(world, {.pp = 1, .dp = 2, .tp = 2});
    EXPECT_EQ(mesh.cp(), nullptr);
    EXPECT_EQ(&mesh.replicas(), &mesh.dp());
  });
}

}  // namespace
}  // namespace lattice
