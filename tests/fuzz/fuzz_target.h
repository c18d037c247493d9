// Fuzz targets for the readers of hostile files (scripts/fuzz.sh, docs/development.md).
//
// Each tests/fuzz/<name>_fuzz.cpp defines one target with LATTICE_FUZZ_TARGET(name) { ... },
// a body that feeds `input` to the real reader the product uses. The same source builds two
// ways:
//   - a libFuzzer executable (LATTICE_LIBFUZZER defined, clang, ASan + UBSan): the macro also
//     defines LLVMFuzzerTestOneInput;
//   - part of the replay test (fuzz_replay_test.cpp, any compiler): the body is registered under
//     `name`, and every file of corpus/<name>/ and regressions/<name>/ goes through it.
//
// The verdict on an input is the same in both (run_fuzz_input): the reader accepts it, or
// refuses it with a documented lattice::Error (IoError, ConfigError, ValueError, ...). Anything
// else is a finding: a crash or sanitizer report, a hang, a leak, an exception of another type,
// or a ContractError, which means input reached an internal invariant that the reader should
// have checked and named.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>

namespace lattice::fuzz {

using FuzzBody = void (*)(std::span<const uint8_t> input);

// Runs `body` on `input`, swallowing documented refusals; a ContractError or any other
// exception propagates (under libFuzzer: std::terminate, a crash it records).
void run_fuzz_input(FuzzBody body, std::span<const uint8_t> input);

// The bytes as text, for readers that parse a string.
inline std::string_view as_text(std::span<const uint8_t> input) {
  return {reinterpret_cast<const char*>(input.data()), input.size()};
}

// Writes `input` to `file_name` in this process's scratch directory (created once, removed at
// exit) and returns its path, for readers that only open files. The same path each time.
const std::filesystem::path& write_input_file(std::span<const uint8_t> input,
                                              std::string_view file_name);

// Every target linked into this executable, by name.
std::map<std::string, FuzzBody>& fuzz_targets();
struct FuzzRegistration {
  FuzzRegistration(const char* name, FuzzBody body) { fuzz_targets().emplace(name, body); }
};

}  // namespace lattice::fuzz

#ifdef LATTICE_LIBFUZZER
#define LATTICE_FUZZ_ENTRY_(name)                                             \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {   \
    ::lattice::fuzz::run_fuzz_input(&lattice_fuzz_body_##name, {data, size}); \
    return 0;                                                                 \
  }
#else
#define LATTICE_FUZZ_ENTRY_(name)
#endif

#define LATTICE_FUZZ_TARGET(name)                                                  \
  static void lattice_fuzz_body_##name(std::span<const uint8_t> input);            \
  static const ::lattice::fuzz::FuzzRegistration lattice_fuzz_registration_##name( \
      #name, &lattice_fuzz_body_##name);                                           \
  LATTICE_FUZZ_ENTRY_(name)                                                        \
  static void lattice_fuzz_body_##name(std::span<const uint8_t> input)
