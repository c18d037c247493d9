#include "cli/layout_flags.h"

#include "cli/validators.h"
#include "core/error.h"

namespace lattice::cli {

void add_layout_flags(CLI::App& command, LayoutFlags& flags) {
  CLI::App* cmd = &command;
  ParallelConfig& layout = flags.layout;
  cmd->add_option("--dp", layout.dp, "Data-parallel ranks (parallel.dp)")->check(positive_number());
  cmd->add_option("--tp", layout.tp,
                  "Tensor-parallel ranks: heads, d_ff and vocabulary split (parallel.tp)")
      ->check(positive_number());
  cmd->add_option("--cp", layout.cp,
                  "Context-parallel ranks: each sequence split over them, attention as a ring "
                  "(parallel.cp)")
      ->check(positive_number());
  cmd->add_option("--ep", layout.ep,
                  "Expert-parallel ranks: a mixture-of-experts layer's experts spread over ep "
                  "consecutive dp ranks, tokens exchanged by all-to-all (parallel.ep)")
      ->check(positive_number());
  cmd->add_flag("--sp", layout.sequence_parallel,
                "Sequence parallelism: split the residual stream's token rows over the tp group "
                "(parallel.sp; --sp=false turns it off)");
  cmd->add_option("--transport", flags.transport,
                  "threads (in-process ranks) or mpi (one rank per process, under mpirun) "
                  "(parallel.transport)");
  cmd->add_option(
         "--zero", layout.zero,
         "ZeRO stage: 0 replicated, 1 optimizer state sharded over dp, 2 and gradients, 3 and "
         "parameters (parallel.zero)")
      ->check(CLI::Range(0, 3));
  cmd->add_option("--bucket-mb", layout.bucket_mb,
                  "Gradient bucket size in MB, dp > 1 (parallel.bucket_mb)")
      ->check(positive_number());
  cmd->add_option("--pp", layout.pp, "Pipeline stages (parallel.pp)")->check(positive_number());
  cmd->add_option("--schedule", flags.schedule,
                  "Pipeline schedule: gpipe, 1f1b, interleaved-1f1b, zb-h1 (parallel.schedule)");
  cmd->add_option("--virtual-stages", layout.virtual_stages,
                  "Model chunks per pipeline stage, for interleaved-1f1b (parallel.virtual_stages)")
      ->check(positive_number());
  cmd->add_option("--layers-per-chunk", layout.layers_per_chunk,
                  "Pipeline chunks' layer counts in model order, e.g. 3,5 (default: balanced by "
                  "the cost model; parallel.layers_per_chunk)")
      ->delimiter(',');
  cmd->add_option("--recompute", flags.recompute,
                  "Activation recompute: none, selective, full (parallel.recompute)");
  cmd->add_flag("--deterministic", layout.deterministic,
                "Pin every collective to ring, never re-tuned: runs of one layout agree bit for "
                "bit (parallel.deterministic; default: the tuner's choice per message size)");
  cmd->add_flag("--check-replicas", layout.check_replicas,
                "After every step, check that all dp replicas hold identical parameters "
                "(parallel.check_replicas)");
}

namespace {

// A choice flag parsed by its config key's parser (the TOML's too), its refusal prefixed with
// the flag and the value given: the same ConfigError (exit 3) as the key's in the config.
template <typename Parse>
auto parse_choice_flag(const char* flag, const std::string& value, Parse parse) {
  try {
    return parse(value);
  } catch (const ConfigError& e) {
    LATTICE_THROW(ConfigError, "{} {}: {}", flag, value, e.what());
  }
}

}  // namespace

void apply_layout_flags(const CLI::App& cmd, const LayoutFlags& flags, ParallelConfig& layout) {
  const ParallelConfig& given_values = flags.layout;
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  if (given("--dp")) layout.dp = given_values.dp;
  if (given("--tp")) layout.tp = given_values.tp;
  if (given("--cp")) layout.cp = given_values.cp;
  if (given("--ep")) layout.ep = given_values.ep;
  if (given("--sp")) layout.sequence_parallel = given_values.sequence_parallel;
  if (given("--zero")) layout.zero = given_values.zero;
  if (given("--bucket-mb")) layout.bucket_mb = given_values.bucket_mb;
  if (given("--transport")) {
    layout.transport = parse_choice_flag("--transport", flags.transport, [](std::string_view name) {
      return parse_transport(name);
    });
  }
  if (given("--check-replicas")) layout.check_replicas = given_values.check_replicas;
  if (given("--deterministic")) layout.deterministic = given_values.deterministic;
  if (given("--pp")) layout.pp = given_values.pp;
  if (given("--schedule")) {
    layout.schedule = parse_choice_flag("--schedule", flags.schedule, [](std::string_view name) {
      return parse_schedule_kind(name);
    });
  }
  if (given("--virtual-stages")) layout.virtual_stages = given_values.virtual_stages;
  if (given("--recompute")) {
    layout.recompute = parse_choice_flag("--recompute", flags.recompute, [](std::string_view name) {
      return parse_recompute(name);
    });
  }
  if (given("--layers-per-chunk")) layout.layers_per_chunk = given_values.layers_per_chunk;
}

TrainConfig resolve_layout_config(const std::string& path,
                                  const std::vector<std::string>& overrides, const CLI::App& cmd,
                                  const LayoutFlags& flags) {
  TrainConfig config = load_train_config(path, overrides);
  apply_layout_flags(cmd, flags, config.parallel);
  return config;
}

}  // namespace lattice::cli
