// Replays every seed (corpus/<target>/) and every input a reader once crashed on
// (regressions/<target>/) through the fuzz harnesses, without libFuzzer. A seed must be
// accepted or refused with a documented lattice::Error (fuzz_target.h); a regression must be
// refused with one (it was hostile: the fixed reader names what is wrong), unless its name
// contains ".valid." (an input that is fine but once crashed a reader). A ContractError or
// another exception fails the test naming the file; a crash fails it by ending the process
// (under LATTICE_SANITIZE="address;undefined" the memory error or undefined behaviour an input
// once caused is a crash too; without sanitizers it may pass silently, hence the refusal check).
#include <gtest/gtest.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz/fuzz_target.h"

namespace lattice::fuzz {
namespace {

namespace fs = std::filesystem;

const fs::path kFuzzDir = LATTICE_FUZZ_DIR;
// One per tests/fuzz/<name>_fuzz.cpp.
const std::vector<std::string> kTargets = {"toml_config", "safetensors",     "manifest",
                                           "token_file",  "cluster_profile", "model_file"};

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  if (!fs::is_directory(dir)) return files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(FuzzTargets, EveryHarnessIsRegisteredAndEveryInputDirNamesOne) {
  std::set<std::string> registered;
  for (const auto& [name, body] : fuzz_targets()) registered.insert(name);
  EXPECT_EQ(registered, std::set<std::string>(kTargets.begin(), kTargets.end()));
  for (const char* sub : {"corpus", "regressions"}) {
    if (!fs::is_directory(kFuzzDir / sub)) continue;
    for (const fs::directory_entry& e : fs::directory_iterator(kFuzzDir / sub)) {
      EXPECT_TRUE(registered.count(e.path().filename().string()))
          << e.path() << " names no fuzz target";
    }
  }
}

class FuzzReplay : public testing::TestWithParam<std::string> {};

TEST_P(FuzzReplay, SeedsAreReadOrRefusedAndRegressionsAreRefusedWithALatticeError) {
  const auto it = fuzz_targets().find(GetParam());
  ASSERT_NE(it, fuzz_targets().end()) << GetParam() << " has no harness linked in";
  const std::vector<fs::path> seeds = files_in(kFuzzDir / "corpus" / GetParam());
  ASSERT_GE(seeds.size(), 3u) << "the seed corpus of " << GetParam() << " is missing";
  std::vector<fs::path> inputs = seeds;
  const std::vector<fs::path> regressions = files_in(kFuzzDir / "regressions" / GetParam());
  inputs.insert(inputs.end(), regressions.begin(), regressions.end());

  int seeds_accepted = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const fs::path& path = inputs[i];
    const bool is_seed = i < seeds.size();
    const std::vector<uint8_t> bytes = read_bytes(path);
    try {
      it->second(bytes);
      if (is_seed) {
        ++seeds_accepted;
      } else if (path.filename().string().find(".valid.") == std::string::npos) {
        ADD_FAILURE() << path << ": a hostile regression input was accepted; the reader should "
                      << "refuse it with a lattice::Error naming what is wrong";
      }
    } catch (const ContractError& e) {
      ADD_FAILURE() << path << ": ContractError (input reached an internal check): " << e.what();
    } catch (const Error& e) {
      // refused with a documented error
    } catch (const std::exception& e) {
      ADD_FAILURE() << path << ": undocumented exception: " << e.what();
    }
  }
  // The seeds include valid files: a harness that refuses everything tests nothing deep.
  EXPECT_GE(seeds_accepted, 1) << "no seed of " << GetParam() << " was accepted";
  RecordProperty("inputs", int(inputs.size()));
  RecordProperty("regressions", int(regressions.size()));
}

INSTANTIATE_TEST_SUITE_P(Readers, FuzzReplay, testing::ValuesIn(kTargets),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace lattice::fuzz
