#include "elastic/fault_injection.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <thread>

#include <spdlog/spdlog.h>

namespace lattice {
namespace {

constexpr std::array<std::string_view, 5> kKindNames = {"kill", "stop", "hang", "throw", "slow"};

constexpr const char* kGrammar =
    "kind@phase:rank:step[:times] (step: a number or *) with kind kill|stop|hang|throw|slow and "
    "phase "
    "forward|backward|collective|optimizer|snapshot|checkpoint|recovery, e.g. "
    "kill@backward:2:300";

template <typename Int>
bool parse_int(std::string_view text, Int& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == separator) {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  return parts;
}

FaultSpec parse_one(std::string_view item) {
  auto bad = [&](std::string_view why) {
    LATTICE_THROW(ConfigError, "LATTICE_FAULT item '{}': {} ---> HINT: write {}", item, why,
                  kGrammar);
  };
  const size_t at = item.find('@');
  if (at == std::string_view::npos) bad("no '@' between the kind and the phase");
  FaultSpec spec;
  const std::string_view kind = item.substr(0, at);
  size_t k = 0;
  while (k < kKindNames.size() && kKindNames[k] != kind) ++k;
  if (k == kKindNames.size()) bad(fmt::format("unknown kind '{}'", kind));
  spec.kind = FaultKind(k);
  const std::vector<std::string_view> fields = split(item.substr(at + 1), ':');
  if (fields.size() < 3 || fields.size() > 4) bad("expected phase:rank:step[:times]");
  if (!parse_phase(fields[0], spec.phase) || spec.phase == Phase::kStarting ||
      spec.phase == Phase::kFinishing || spec.phase == Phase::kEvaluate) {
    bad(fmt::format("unknown phase '{}'", fields[0]));
  }
  if (!parse_int(fields[1], spec.rank) || spec.rank < 0) bad("the rank is not a number >= 0");
  if (fields[2] == "*") {
    spec.step = kAnyStep;
  } else if (!parse_int(fields[2], spec.step) || spec.step < 0) {
    bad("the step is not a number >= 0 or *");
  }
  if (fields.size() == 4 && (!parse_int(fields[3], spec.times) || spec.times < 1)) {
    bad("times is not a number >= 1");
  }
  return spec;
}

}  // namespace

std::string_view fault_kind_name(FaultKind kind) {
  return kKindNames[size_t(kind)];
}

std::string FaultSpec::to_string() const {
  std::string text = fmt::format("{}@{}:{}:{}", fault_kind_name(kind), phase_name(phase), rank,
                                 step == kAnyStep ? std::string("*") : std::to_string(step));
  if (times != 1) text += fmt::format(":{}", times);
  return text;
}

std::vector<FaultSpec> parse_fault_specs(std::string_view text) {
  std::vector<FaultSpec> specs;
  for (std::string_view item : split(text, ',')) {
    if (!item.empty()) specs.push_back(parse_one(item));
  }
  return specs;
}

FaultInjector::FaultInjector(std::vector<FaultSpec> faults, int rank,
                             std::filesystem::path count_dir, int slow_ms)
    : faults_(std::move(faults)),
      fired_(faults_.size(), 0),
      rank_(rank),
      count_dir_(std::move(count_dir)),
      slow_ms_(slow_ms) {}

std::optional<FaultInjector> FaultInjector::from_environment(int rank,
                                                             std::filesystem::path count_dir) {
  const char* text = std::getenv("LATTICE_FAULT");
  if (text == nullptr || *text == '\0') return std::nullopt;
  int slow_ms = 50;
  if (const char* slow = std::getenv("LATTICE_FAULT_SLOW_MS")) {
    if (!parse_int(std::string_view(slow), slow_ms) || slow_ms < 0) {
      LATTICE_THROW(ConfigError, "LATTICE_FAULT_SLOW_MS='{}' is not a number of milliseconds",
                    slow);
    }
  }
  return FaultInjector(parse_fault_specs(text), rank, std::move(count_dir), slow_ms);
}

bool FaultInjector::claim(size_t index) {
  const FaultSpec& fault = faults_[index];
  if (count_dir_.empty()) return fired_[index]++ < fault.times;
  // One file per firing, created exclusively: processes of every generation share the count.
  for (int n = 0; n < fault.times; ++n) {
    const std::filesystem::path marker = count_dir_ / fmt::format("fault{}.fired{}", index, n);
    const int fd = ::open(marker.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd >= 0) {
      ::close(fd);
      return true;
    }
  }
  return false;
}

void FaultInjector::at(Phase phase, int64_t step) {
  for (size_t i = 0; i < faults_.size(); ++i) {
    const FaultSpec& fault = faults_[i];
    if (fault.rank != rank_ || fault.phase != phase) continue;
    if (fault.kind == FaultKind::kSlow) {
      if (step >= fault.step) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms_));
      continue;
    }
    if ((fault.step == kAnyStep || fault.step == step) && claim(i)) fire(fault, step);
  }
}

void FaultInjector::fire(const FaultSpec& fault, int64_t step) {
  spdlog::warn("rank {}: injected fault {} fires at step {} (pid {})", rank_, fault.to_string(),
               step, int(::getpid()));
  switch (fault.kind) {
    case FaultKind::kKill:
      ::raise(SIGKILL);
      break;
    case FaultKind::kStop:
      ::raise(SIGSTOP);
      break;
    case FaultKind::kHang:
      // A livelock: this thread spins (the heartbeat thread goes on), nothing progresses.
      for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    case FaultKind::kThrow:
      LATTICE_THROW(FaultInjected, "rank {}: injected fault {} at step {}", rank_,
                    fault.to_string(), step);
    case FaultKind::kSlow:
      break;
  }
}

}  // namespace lattice
