#include "forecast/forecast.h"

#include <fmt/format.h>

#include "core/error.h"
#include "plan/evaluation.h"
#include "plan/memory_model.h"
#include "plan/time_model.h"
#include "plan/validation.h"

namespace lattice {

plan::ModelSpec plan_model_spec(const ModelConfig& c, int64_t tp) {
  plan::ModelSpec spec;
  spec.name = c.name;
  spec.n_layers = c.n_layer;
  spec.n_heads = c.n_head;
  spec.n_kv_heads = c.n_kv_head;
  spec.d_model = c.d_model;
  spec.d_ff = c.d_ff;
  spec.vocab_size = c.vocab_size;
  spec.padded_vocab_size = (c.vocab_size + tp - 1) / tp * tp;
  spec.max_seq_len = c.seq_len;
  spec.norm =
      c.norm == NormKind::kLayerNorm ? plan::NormKind::kLayerNorm : plan::NormKind::kRmsNorm;
  spec.position = c.position == PositionKind::kLearned ? plan::PositionKind::kLearned
                                                       : plan::PositionKind::kRope;
  spec.mlp = c.mlp == MlpKind::kGelu ? plan::MlpKind::kGelu : plan::MlpKind::kSwiglu;
  spec.biases = c.bias;
  spec.tied_embeddings = c.tied_embeddings;
  spec.fused_qkv = c.family == ModelFamily::kGpt2;
  spec.n_experts = c.n_experts;
  spec.experts_per_token = c.moe() ? c.experts_per_token : 0;
  plan::validate(spec);
  return spec;
}

plan::Layout plan_layout(const TrainConfig& config) {
  const ParallelConfig& p = config.parallel;
  return {.dp = p.dp,
          .tp = p.tp,
          .pp = p.pp,
          .virtual_stages = p.pp > 1 ? p.virtual_stages : 1,
          .zero = p.zero,
          .micro_batch = config.micro_batch,
          .recompute = p.recompute,
          .sequence_parallel = p.sequence_parallel,
          .schedule = p.schedule,
          .layers_per_chunk =
              std::vector<int64_t>(p.layers_per_chunk.begin(), p.layers_per_chunk.end()),
          .cp = p.cp,
          .ep = p.ep};
}

ParallelConfig runtime_layout(const plan::Layout& layout) {
  ParallelConfig p;
  p.dp = int(layout.dp);
  p.tp = int(layout.tp);
  p.cp = int(layout.cp);
  p.ep = int(layout.ep);
  p.sequence_parallel = layout.sequence_parallel;
  p.zero = layout.zero;
  p.pp = int(layout.pp);
  p.schedule = layout.schedule;
  p.virtual_stages = int(layout.virtual_stages);
  p.recompute = layout.recompute;
  p.layers_per_chunk.assign(layout.layers_per_chunk.begin(), layout.layers_per_chunk.end());
  return p;
}

plan::TrainingSetup plan_setup(const TrainConfig& config, const plan::Layout& layout,
                               plan::ClusterSpec cluster) {
  plan::TrainingSetup setup;
  setup.model = plan_model_spec(config.model, layout.tp);
  setup.cluster = std::move(cluster);
  setup.devices = layout.devices();
  setup.global_batch = config.global_batch;
  setup.seq_len = config.seq_len > 0 ? config.seq_len : config.model.seq_len;
  setup.precision =
      config.compute_dtype == DType::kBF16 ? plan::Precision::kBf16 : plan::Precision::kFp32;
  setup.fp32_gradients = true;
  setup.runtime = plan::Runtime::kLattice;
  plan::validate(setup);
  return setup;
}

nlohmann::json forecast_run(const TrainConfig& given, const plan::ClusterSpec& cluster,
                            const std::string& source) {
  TrainConfig config = given;
  config.resolve_batch(config.parallel.dp);
  const plan::Layout layout = plan_layout(config);
  nlohmann::json out = {
      {"cluster", cluster.name}, {"source", source}, {"layout", plan::describe(layout)}};
  const plan::TrainingSetup setup = plan_setup(config, layout, cluster);
  if (const auto rejection = plan::check_layout(setup, layout)) {
    out["rejected"] = rejection->message;
    return out;
  }
  const plan::TimeBreakdown time = plan::estimate_time(setup, layout);
  out["step_ms"] = 1e3 * time.step;
  out["parts_ms"] = {{"compute", 1e3 * (time.forward + time.backward + time.recompute +
                                        time.tp_communication + time.synchronisation)},
                     {"optimizer", 1e3 * time.optimizer},
                     {"exposed_comm", 1e3 * time.dp_communication},
                     {"pipeline_idle", 1e3 * (time.bubble + time.pp_communication)}};
  out["stages"] = nlohmann::json::array();
  for (int64_t stage = 0; stage < layout.pp; ++stage) {
    // compare_layout's rows group the planner's components as the arena's categories.
    const plan::LayoutValidation rows = plan::compare_layout(
        "", layout, plan::estimate_stage_memory(setup, layout, stage), time, {}, {});
    nlohmann::json s = {{"stage", stage}};
    for (const plan::ValidationRow& row : rows.rows) {
      if (!row.is_time) s[row.quantity] = row.predicted;
    }
    out["stages"].push_back(std::move(s));
  }
  return out;
}

}  // namespace lattice
