// Registration of the `lattice` subcommands; each lives in its own <name>_command.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "train/train_config.h"

namespace lattice::cli {

void register_commands(CLI::App& app);

void register_train_command(CLI::App& app);
// The config of a `train CONFIG [flags]` command line, parsed as `lattice train` parses it (the
// agent's view of what its ranks will run). ConfigError for a malformed one.
TrainConfig parse_train_command(const std::vector<std::string>& command);
void register_sample_command(CLI::App& app);
void register_export_command(CLI::App& app);
void register_plan_command(CLI::App& app);
void register_data_command(CLI::App& app);
void register_bench_comm_command(CLI::App& app);
void register_bench_command(CLI::App& app);  // bench train, bench calibrate
void register_bench_tp_command(CLI::App& app);
void register_bench_cp_command(CLI::App& app);
void register_bench_moe_command(CLI::App& app);
void register_bench_dp_command(CLI::App& app);
void register_bench_pipeline_command(CLI::App& app);  // bench pipeline
void register_ckpt_command(CLI::App& app);            // ckpt inspect
void register_explain_command(CLI::App& app);
void register_launch_command(CLI::App& app);         // the elastic agent
void register_bench_elastic_command(CLI::App& app);  // bench elastic
void register_doctor_command(CLI::App& app);
void register_report_command(CLI::App& app);

}  // namespace lattice::cli
