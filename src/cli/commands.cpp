#include "cli/commands.h"

namespace lattice::cli {

void register_commands(CLI::App& app) {
  register_train_command(app);
  register_sample_command(app);
  register_export_command(app);
  register_plan_command(app);
  register_data_command(app);
  register_bench_comm_command(app);
  register_bench_command(app);
  register_bench_tp_command(app);
  register_bench_cp_command(app);
  register_bench_moe_command(app);
  register_bench_dp_command(app);
  register_bench_pipeline_command(app);
  register_ckpt_command(app);
  register_explain_command(app);
  register_launch_command(app);
  register_bench_elastic_command(app);
  register_doctor_command(app);
  register_report_command(app);
}

}  // namespace lattice::cli
