// dp × tp × pp training on the mpi transport, one rank per process under `mpirun -np 4` and
// `mpirun -np 8` (CTest label `mpi`): the same Trainer and mesh as the in-process tests, on MPI.
// Each process also trains the single-rank reference itself (no communication) and compares its
// losses with the mesh's. The layouts run are those whose size is the MPI world's.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "../../train/equivalence_config.h"
#include "../../train/test_corpus.h"
#include "comm/launch.h"
#include "parallel/device_mesh.h"
#include "train/trainer.h"

namespace lattice {
namespace {

constexpr int kSteps = 6;

TrainConfig mpi_config(const std::string& preset) {
  // Each process writes its own copy of the corpus: the processes share a file system, and the
  // np4 and np8 runs of this test may run at the same time.
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  auto dir = testing::make_corpus_dir(std::string("mpi_mesh_np") + (size ? size : "1") + "_" +
                                      (rank ? rank : "0"));
  ModelConfig model = model_preset(preset);
  model.seq_len = 12;
  model.n_layer = 4;  // four pipeline stages of one layer
  return testing::equivalence_config(model, dir, {.steps = kSteps});
}

std::vector<double> train_losses(Trainer& trainer) {
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) losses.push_back(trainer.train_step().loss);
  return losses;
}

struct MeshCase {
  const char* preset;
  MeshShape shape;
  bool sp;
  int zero;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
};

int mpi_world_size() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  return size != nullptr ? std::stoi(size) : 1;
}

// One launch for all layouts: the meshes are carved out of the same MPI world one after another.
TEST(MeshTrainingMpi, EveryLayoutMatchesTheSingleRankRun) {
  const std::vector<MeshCase> cases = {
      {"llama-tiny", {.pp = 1, .dp = 1, .tp = 4}, true, 0},
      {"gpt2-tiny", {.pp = 1, .dp = 2, .tp = 2}, true, 0},
      {"gpt2-tiny", {.pp = 1, .dp = 2, .tp = 2}, false, 1},
      {"gpt2-tiny", {.pp = 1, .dp = 4, .tp = 1}, false, 1},
      {"gpt2-tiny", {.pp = 1, .dp = 4, .tp = 1}, false, 0},
      {"gpt2-tiny", {.pp = 1, .dp = 4, .tp = 1}, false, 3},
      {"llama-tiny", {.pp = 1, .dp = 2, .tp = 2}, true, 2},
      {"gpt2-tiny", {.pp = 1, .dp = 2, .tp = 2}, true, 3},
      {"gpt2-tiny", {.pp = 2, .dp = 1, .tp = 2}, true, 0, ScheduleKind::kZeroBubbleH1},
      {"llama-tiny", {.pp = 4, .dp = 1, .tp = 1}, false, 0, ScheduleKind::kOneFOneB},
      {"gpt2-tiny", {.pp = 2, .dp = 2, .tp = 2}, true, 1, ScheduleKind::kOneFOneB},
      {"llama-tiny", {.pp = 2, .dp = 2, .tp = 2}, false, 1, ScheduleKind::kGpipe},
  };
  const int world_size = mpi_world_size();
  std::vector<std::vector<double>> expected;
  for (const MeshCase& c : cases) {
    if (c.shape.world_size() != world_size) {
      expected.emplace_back();
      continue;
    }
    Arena arena("reference");
    Trainer reference(mpi_config(c.preset), arena, {.threads = 1});
    expected.push_back(train_losses(reference));
  }
  launch_ranks(TransportKind::kMpi, world_size, [&](Communicator& world) {
    ASSERT_EQ(world.transport_kind(), TransportKind::kMpi);
    int ran = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const MeshCase& c = cases[i];
      if (c.shape.world_size() != world_size) continue;
      ++ran;
      DeviceMesh mesh(world, c.shape);
      Arena arena("rank");
      Trainer trainer(mpi_config(c.preset), arena,
                      {.dp = &mesh.dp(),
                       .zero = c.zero,
                       .bucket_bytes = 8 << 10,
                       .check_replicas = true,
                       .threads = 1,
                       .tp = &mesh.tp(),
                       .sequence_parallel = c.sp,
                       .pp = &mesh.pp(),
                       .embedding = mesh.embedding(),
                       .schedule = c.schedule});
      const std::vector<double> losses = train_losses(trainer);
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_NEAR(losses[size_t(s)], expected[i][size_t(s)], 1e-5 * expected[i][size_t(s)])
            << c.preset << " " << c.shape.to_string() << " rank " << world.rank() << " step "
            << s + 1;
      }
    }
    EXPECT_GE(ran, 2) << "no layout of " << world_size << " ranks";
  });
}

}  // namespace
}  // namespace lattice
