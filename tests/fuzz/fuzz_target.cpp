#include "fuzz/fuzz_target.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <system_error>

#include "core/error.h"

namespace lattice::fuzz {

namespace fs = std::filesystem;

void run_fuzz_input(FuzzBody body, std::span<const uint8_t> input) {
  try {
    body(input);
  } catch (const ContractError&) {
    throw;  // input reached an internal invariant: a finding, not a refusal
  } catch (const Error&) {
    // Refused with a documented error: what a reader should do with a hostile file.
  }
}

namespace {

const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("lattice_fuzz_" + std::to_string(::getpid()));
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ignored;
      fs::remove_all(scratch_dir(), ignored);
    });
    return d;
  }();
  return dir;
}

}  // namespace

const fs::path& write_input_file(std::span<const uint8_t> input, std::string_view file_name) {
  static std::map<std::string, fs::path, std::less<>> paths;
  auto it = paths.find(file_name);
  if (it == paths.end()) it = paths.emplace(file_name, scratch_dir() / file_name).first;
  std::ofstream out(it->second, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(input.data()), std::streamsize(input.size()));
  out.close();
  if (!out) std::abort();  // the harness itself failed: not the reader's fault, stop loudly
  return it->second;
}

std::map<std::string, FuzzBody>& fuzz_targets() {
  static std::map<std::string, FuzzBody> targets;
  return targets;
}

}  // namespace lattice::fuzz
