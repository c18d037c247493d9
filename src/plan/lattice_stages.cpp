#include "plan/lattice_stages.h"

#include <algorithm>

#include "core/error.h"
#include "plan/pipeline_theory.h"
#include "spec/transformer_partition.h"

namespace lattice::plan {

int64_t LatticeStagePart::layers() const {
  int64_t n = 0;
  for (const LatticeChunk& c : chunks) n += c.layers();
  return n;
}

bool LatticeStagePart::has_embedding() const {
  return std::any_of(chunks.begin(), chunks.end(),
                     [](const LatticeChunk& c) { return c.embedding; });
}

bool LatticeStagePart::has_head() const {
  return std::any_of(chunks.begin(), chunks.end(), [](const LatticeChunk& c) { return c.head; });
}

std::vector<int64_t> lattice_layers_per_chunk(const ModelSpec& model, int64_t p, int64_t v,
                                              const std::vector<int64_t>& given) {
  const int64_t chunks = p * v, layers = model.n_layers;
  if (p < 1 || v < 1 || layers < chunks) {
    LATTICE_THROW(ConfigError,
                  "{} layers cannot fill p·v = {}·{} pipeline chunks of at least one layer ---> "
                  "HINT: use fewer pipeline stages or virtual stages",
                  layers, p, v);
  }
  // The runtime's own partition (train/pipeline_stage.cpp partition_model calls the same).
  const StagePartition partition =
      partition_transformer({.n_layer = model.n_layers,
                             .d_model = model.d_model,
                             .d_ff = model.d_ff,
                             .kv_width = model.kv_dim(),
                             .vocab_size = model.vocab_size,
                             .seq_len = model.max_seq_len,
                             .mlp = model.mlp,
                             .position = model.position,
                             .tied_embeddings = model.tied_embeddings},
                            int(p), int(v), std::vector<int>(given.begin(), given.end()));
  std::vector<int64_t> counts;
  for (const ChunkLayers& chunk : partition.chunks) counts.push_back(chunk.layer_count());
  return counts;
}

LatticeStagePart lattice_stage_part(const ModelSpec& model, int64_t p, int64_t v, int64_t stage,
                                    const std::vector<int64_t>& given) {
  LatticeStagePart part;
  if (p * v <= 1) {
    part.chunks.push_back({0, model.n_layers, true, true});
    return part;
  }
  const std::vector<int64_t> counts = given.empty() ? lattice_layers_per_chunk(model, p, v) : given;
  int64_t first = 0;
  for (int64_t k = 0; k < p * v; ++k) {
    const int64_t last = first + counts[size_t(k)];
    if (k % p == stage) part.chunks.push_back({first, last, k == 0, k == p * v - 1});
    first = last;
  }
  return part;
}

int64_t lattice_activation_slots(Schedule schedule, int64_t p, int64_t m, int64_t v,
                                 int64_t stage) {
  if (p <= 1) return 1;
  // The runtime counts a micro-batch live until its weight pass: zb-h1 delays those, so every
  // stage holds min(m, p), not 1F1B's min(m, p − stage) of chunks_in_flight.
  if (schedule == Schedule::kZeroBubbleH1) return std::min(m, p);
  return std::min(chunks_in_flight(schedule, p, m, v, stage), m);
}

}  // namespace lattice::plan
