#include "ckpt/model_config_json.h"

#include "core/error.h"

namespace lattice {

nlohmann::json model_config_to_json(const ModelConfig& c) {
  nlohmann::json j = {{"name", c.name},
                      {"family", family_name(c.family)},
                      {"vocab_size", c.vocab_size},
                      {"n_layer", c.n_layer},
                      {"n_head", c.n_head},
                      {"n_kv_head", c.n_kv_head},
                      {"d_model", c.d_model},
                      {"d_ff", c.d_ff},
                      {"seq_len", c.seq_len},
                      {"norm", norm_name(c.norm)},
                      {"norm_eps", c.norm_eps},
                      {"position", position_name(c.position)},
                      {"rope_theta", c.rope_theta},
                      {"mlp", mlp_name(c.mlp)},
                      {"bias", c.bias},
                      {"tied_embeddings", c.tied_embeddings},
                      {"init_std", c.init_std}};
  // Only a sparse model carries the expert keys: a dense model's JSON, and so the config hash
  // of its checkpoints, stays what it was before experts existed.
  if (c.moe()) {
    j["n_experts"] = c.n_experts;
    j["experts_per_token"] = c.experts_per_token;
    j["moe_aux_loss"] = c.moe_aux_loss;
    j["moe_z_loss"] = c.moe_z_loss;
    j["capacity_factor"] = c.capacity_factor;
  }
  return j;
}

ModelConfig model_config_from_json(const nlohmann::json& j) {
  try {
    ModelConfig c;
    c.name = j.at("name").get<std::string>();
    c.family = parse_family(j.at("family").get<std::string>());
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.n_layer = j.at("n_layer").get<int64_t>();
    c.n_head = j.at("n_head").get<int64_t>();
    c.n_kv_head = j.at("n_kv_head").get<int64_t>();
    c.d_model = j.at("d_model").get<int64_t>();
    c.d_ff = j.at("d_ff").get<int64_t>();
    c.seq_len = j.at("seq_len").get<int64_t>();
    c.norm = parse_norm(j.at("norm").get<std::string>());
    c.norm_eps = j.at("norm_eps").get<float>();
    c.position = parse_position(j.at("position").get<std::string>());
    c.rope_theta = j.at("rope_theta").get<float>();
    c.mlp = parse_mlp(j.at("mlp").get<std::string>());
    c.bias = j.at("bias").get<bool>();
    c.tied_embeddings = j.at("tied_embeddings").get<bool>();
    c.init_std = j.at("init_std").get<float>();
    // Absent in dense models' (and older) checkpoints: ModelConfig's defaults, the dense MLP.
    c.n_experts = j.value("n_experts", c.n_experts);
    c.experts_per_token = j.value("experts_per_token", c.experts_per_token);
    c.moe_aux_loss = j.value("moe_aux_loss", c.moe_aux_loss);
    c.moe_z_loss = j.value("moe_z_loss", c.moe_z_loss);
    c.capacity_factor = j.value("capacity_factor", c.capacity_factor);
    c.validate();
    return c;
  } catch (const nlohmann::json::exception& e) {
    LATTICE_THROW(IoError, "malformed model config in checkpoint: {}", e.what());
  }
}

}  // namespace lattice
