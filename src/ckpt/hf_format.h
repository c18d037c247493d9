// Hugging Face weights: import into a model (`lattice train --init-from`) and export of one
// (`lattice export`), the safetensors layout and config.json transformers reads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/transformer.h"

namespace lattice {

// The config.json transformers reads for `config`: GPT2LMHeadModel, LlamaForCausalLM, or for a
// model with experts MixtralForCausalLM (with lattice_router_z_loss_coef and
// lattice_capacity_factor, which transformers has no keys for and ignores). ValueError when the
// family cannot express one of the model's switches.
nlohmann::json hf_config_json(const ModelConfig& config);
// The ModelConfig a Hugging Face config.json (model_type gpt2, llama or mixtral) describes, the
// inverse of hf_config_json for every field but the name (config.json's "_name_or_path", else
// the model type); an absent key takes transformers' default for it. ConfigError naming the key
// and the fix for another model type, a missing size, or a feature Lattice lacks (a sliding
// window shorter than the context, Mixtral biases or router jitter, rope scaling, another
// activation or head width). `origin` names the file in messages.
ModelConfig model_config_from_hf(const nlohmann::json& config, const std::string& origin);
// model_config_from_hf of `source`'s config.json (a model directory) or of `source` itself (a
// config.json); IoError when it cannot be read.
ModelConfig read_hf_model_config(const std::filesystem::path& source);

// Loads Hugging Face GPT-2, Llama or Mixtral weights (F32, BF16 or F16 tensors, widened
// exactly to the fp32 master weights) into `model`, whose config must match. `source` is a
// .safetensors file or a model directory: its config.json (when present) must agree with the
// model's architecture (ConfigError naming each key, or a feature Lattice lacks), then
// model.safetensors or the hub's sharded model.safetensors.index.json (every file its
// weight_map names) is read. Every expected tensor must be present with its exact shape (a
// Mixtral layer's block_sparse_moe.gate and experts.E.w1/w2/w3 included); a missing,
// unexpected or mis-shaped tensor, or another dtype, is an IoError listing what was expected
// and what was found. GPT-2 files may omit the "transformer." prefix and carry the
// attention-mask buffers (".attn.bias", ".attn.masked_bias"), which are not parameters and are
// skipped. A pipeline stage (a model holding some layers) reads the tensors of its part and
// leaves the others to their stages; the last stage's tied copy of the token table reads the
// table.
void load_hf_weights(const std::filesystem::path& file, Transformer& model);
// What `lattice train --init-from SOURCE` would make of each tensor, from the files' headers
// alone (lattice doctor): the same files, names and rules as load_hf_weights.
struct HfTensorSurvey {
  enum class Kind {
    kExact,       // F32 into the F32 master
    kWidened,     // BF16 or F16 into the F32 master: exact
    kRefused,     // another dtype (I32): the load refuses it
    kMisshaped,   // a parameter of another shape
    kUnexpected,  // no parameter of the model has its name
    kSkipped,     // a known non-parameter (attention-mask buffers, GPT-2's tied lm_head)
  };
  std::string file_name;  // as in the file
  std::string name;       // the model's name for it; "" when skipped
  DType dtype = DType::kF32;
  Shape shape;
  Shape expected;  // the parameter's shape, when the model has one of that name
  Kind kind = Kind::kExact;
};
struct HfWeightsSurvey {
  std::vector<HfTensorSurvey> tensors;
  std::vector<std::string> missing;  // "name [shape]" of every parameter no file holds
};
// ConfigError when config.json describes another architecture; IoError for an unreadable file.
HfWeightsSurvey survey_hf_weights(const std::filesystem::path& source, const ModelConfig& config);

struct HfExportOptions {
  // Largest weight file, as transformers' save_pretrained(max_shard_size="5GB"): a larger model
  // is split into model-0000k-of-0000n.safetensors with model.safetensors.index.json.
  uint64_t max_shard_bytes = 5'000'000'000;
};
// Writes <dir>/config.json and the weights (F32, Hugging Face names): model.safetensors, or the
// hub's shards and index when they exceed options.max_shard_bytes. Weight files an earlier
// export left in <dir> are removed first.
void export_hf(const std::filesystem::path& dir, Transformer& model,
               const HfExportOptions& options = {});

}  // namespace lattice
