// `lattice explain` through the executable: what a rank holds and sends for the layout asked
// for, and the refusals of malformed configs and layouts that do not fit the model.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cli/cli_run.h"
#include "support/scratch_dir.h"

namespace lattice::testing {
namespace {

constexpr double kLimitS = 60;

std::vector<std::string> explain(const std::string& config, std::vector<std::string> extra) {
  std::vector<std::string> args = {LATTICE_EXECUTABLE, "explain", config};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

const std::string kTinyConfig = LATTICE_SOURCE_DIR "/configs/gpt2-tiny.toml";

// The line of `text` that contains `name`, or "".
std::string line_with(const std::string& text, const std::string& name) {
  const size_t at = text.find(name);
  if (at == std::string::npos) return "";
  const size_t begin = text.rfind('\n', at) + 1;
  return text.substr(begin, text.find('\n', at) - begin);
}

// Context parallelism: the rank's two chunks, each hop of its ring with the block products it
// runs (causal on the diagonal, whole before it, none after), and the same work on every rank.
TEST(ExplainCli, ContextParallelShowsEachHopOfTheRingAndItsChunkProducts) {
  const CliResult r = run_cli(explain(kTinyConfig, {"--cp", "4", "--rank", "1"}), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("layout: pp1·dp1·cp4·tp1 = 4 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 holds chunks 1 and 6 of 8 (positions [8, 16) and [48, 56))"),
            std::string::npos)
      << r.out;
  EXPECT_NE(line_with(r.out, "| cp rank 1 |").find("q1×kv1 causal, q6×kv1 whole, q6×kv6 causal"),
            std::string::npos)
      << r.out;
  EXPECT_NE(line_with(r.out, "| cp rank 2 |").find("q6×kv2 whole, q6×kv5 whole"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("8.0 of the 32 chunk products"), std::string::npos) << r.out;
  // The activations are this rank's 16 positions of each 64-position sequence.
  EXPECT_NE(r.out.find("T=16 of each sequence's 64"), std::string::npos) << r.out;

  const CliResult refused = run_cli(explain(kTinyConfig, {"--cp", "3"}), kLimitS);
  EXPECT_EQ(refused.exit_code, 3) << refused.all();
  EXPECT_NE(refused.err.find("multiple of 6"), std::string::npos) << refused.err;
}

// GPT-2's attention reads q, k and v in place in the fused projection's output: its activation
// table has no q, k, v buffers and no gradients of them, unless the ring of context
// parallelism needs them apart.
TEST(ExplainCli, Gpt2KeepsQkvApartOnlyForTheRing) {
  const CliResult plain = run_cli(explain(kTinyConfig, {}), kLimitS);
  ASSERT_EQ(plain.exit_code, 0) << plain.all();
  EXPECT_NE(line_with(plain.out, "layer 0 qkv "), "") << plain.out;
  EXPECT_NE(line_with(plain.out, "grad qkv "), "") << plain.out;
  EXPECT_EQ(line_with(plain.out, "layer 0 q "), "") << plain.out;
  EXPECT_EQ(line_with(plain.out, "grad q "), "") << plain.out;
  const CliResult ring = run_cli(explain(kTinyConfig, {"--cp", "2"}), kLimitS);
  ASSERT_EQ(ring.exit_code, 0) << ring.all();
  for (const char* name : {"layer 0 q ", "layer 0 k ", "layer 0 v ", "grad q ", "grad v "}) {
    EXPECT_NE(line_with(ring.out, name), "") << name << "\n" << ring.out;
  }
}

// A mixture-of-experts model at dp 2 × ep 2: rank 1 lists only its experts (2 and 3) and the
// exchanges of every sparse layer over its ep group, in the order they run.
TEST(ExplainCli, ExpertParallelShowsEachRanksExpertsAndTheAllToAlls) {
  const CliResult r = run_cli(explain(kTinyConfig, {"--set", "model.preset=\"mixtral-tiny\"",
                                                    "--dp", "2", "--ep", "2", "--rank", "1"}),
                              kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("model.layers.0.block_sparse_moe.experts.3.w2.weight"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("block_sparse_moe.experts.0."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("this rank holds experts [2, 4) of each layer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("per layer on ep[pp0·tp0·dp0-1] (2 ranks)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("forward   all_to_all  dispatch: the rows"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("backward  all_to_all  grad of the rows"), std::string::npos) << r.out;

  const CliResult refused = run_cli(
      explain(kTinyConfig, {"--set", "model.preset=\"mixtral-tiny\"", "--dp", "2", "--ep", "3"}),
      kLimitS);
  EXPECT_EQ(refused.exit_code, 3) << refused.all();
}

TEST(ExplainCli, TensorParallelShowsEachRanksHalfOfTheShardedWeights) {
  const CliResult r = run_cli(explain(kTinyConfig, {"--tp", "2", "--rank", "1"}), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("lattice explain: gpt2-tiny (gpt2, 2 layers, C=64, 4 heads"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("parameters on rank 1 (tp rank 1 of 2)"), std::string::npos) << r.out;
  // The MLP's first weight (C -> F) is split by its output columns, rank 1 the second half;
  // its second weight by its input rows; the layer norms are replicated.
  const std::string fc = line_with(r.out, "transformer.h.0.mlp.c_fc.weight ");
  EXPECT_NE(fc.find("| [64, 256]    | [64, 128]   | dim 1 [128, 256)"), std::string::npos) << fc;
  const std::string proj = line_with(r.out, "transformer.h.0.mlp.c_proj.weight ");
  EXPECT_NE(proj.find("| [256, 64]    | [128, 64]   | dim 0 [128, 256)"), std::string::npos)
      << proj;
  EXPECT_NE(line_with(r.out, "transformer.h.0.ln_1.weight ").find("replicated"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("tensor-parallel collectives of one micro-batch's forward and backward"),
            std::string::npos)
      << r.out;

  const CliResult single = run_cli(explain(kTinyConfig, {}), kLimitS);
  ASSERT_EQ(single.exit_code, 0) << single.all();
  EXPECT_NE(single.out.find("tensor-parallel collectives: none (tp = 1"), std::string::npos)
      << single.out;
}

TEST(ExplainCli, PipelineLayoutPrintsTheScheduleGrid) {
  const CliResult r = run_cli(
      explain(kTinyConfig, {"--pp", "2", "--schedule", "1f1b", "--micro-batches", "4"}), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("pipeline stage 0 holds"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pipeline schedule (unit costs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("activation memory per stage"), std::string::npos) << r.out;
}

// Explain resolves the layout as train does: the config's [parallel] pp, schedule, virtual
// stages, recompute and sp, with no flag; a flag given overrides its key, --sp=false too.
TEST(ExplainCli, TheConfigsParallelSectionIsTheLayoutExplained) {
  const auto config = scratch_dir("explain_parallel") / "pipeline.toml";
  std::ofstream(config) << read_text(kTinyConfig)
                        << "\n[parallel]\npp = 2\nschedule = \"gpipe\"\nrecompute = \"full\"\n"
                           "tp = 2\nsp = true\nlayers_per_chunk = [1, 1]\n";
  const CliResult r = run_cli(explain(config.string(), {"--micro-batches", "4"}), kLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("layout: pp2·dp1·tp2 = 4 ranks (tp fastest), sequence parallel"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("pipeline schedule (unit costs"), std::string::npos) << r.out;
  // GPipe: every forward before the first backward, so stage 0 holds all 4 micro-batches.
  EXPECT_NE(r.out.find("stage 0: 4 slot(s)"), std::string::npos) << r.out;
  const CliResult flags = run_cli(
      explain(config.string(), {"--micro-batches", "4", "--sp=false", "--schedule", "1f1b"}),
      kLimitS);
  ASSERT_EQ(flags.exit_code, 0) << flags.all();
  EXPECT_NE(flags.out.find("layout: pp2·dp1·tp2 = 4 ranks (tp fastest) |"), std::string::npos)
      << flags.out;
  EXPECT_NE(flags.out.find("stage 0: 2 slot(s)"), std::string::npos) << flags.out;
}

TEST(ExplainCli, MalformedTomlNamesTheFileAndLine) {
  const auto config = scratch_dir("explain_malformed") / "broken.toml";
  std::ofstream(config) << "[model]\npreset = \"gpt2-tiny\"\n[batch\nseq_len = 32\n";
  const CliResult r = run_cli(explain(config.string(), {}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find(config.string() + ":3:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("malformed TOML"), std::string::npos) << r.err;
}

TEST(ExplainCli, MissingConfigFileIsNamed) {
  const std::string missing = (scratch_dir("explain_missing") / "nope.toml").string();
  const CliResult r = run_cli(explain(missing, {}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HINT: check the path"), std::string::npos) << r.err;
}

TEST(ExplainCli, MisspelledKeyIsRefusedWithTheKeyItMeant) {
  const CliResult r = run_cli(explain(kTinyConfig, {"--set", "train.lr=1e-3"}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("unknown config key 'train.lr'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean 'optim.lr'?"), std::string::npos) << r.err;
}

TEST(ExplainCli, TensorParallelThatDoesNotDivideTheHeadsIsRefused) {
  const CliResult r = run_cli(explain(kTinyConfig, {"--tp", "3"}), kLimitS);
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("4 attention heads, which do not split over --tp 3"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("HINT: choose a --tp that divides n_head (4)"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lattice::testing
