// Small model configurations the tensor-parallel, checkpoint and explain tests share, by name,
// and the GoogleTest-safe spelling of a case name.
#pragma once

#include <string>
#include <string_view>

#include "model/config.h"

namespace lattice::testing {

// A preset, or one of the variants below that exercise a layout the presets cannot.
inline ModelConfig test_model(std::string_view name) {
  if (name == "gpt2-6h") {  // a three-way split; tp 3 pads the vocabulary of 256 to 258
    ModelConfig c = model_preset("gpt2-tiny");
    c.name = name;
    c.n_head = c.n_kv_head = 6;
    c.d_model = 48;
    c.d_ff = 192;
    return c;
  }
  if (name == "llama-6h-kv3") {  // a three-way split of q and kv heads
    ModelConfig c = model_preset("llama-tiny");
    c.name = name;
    c.n_head = 6;
    c.n_kv_head = 3;
    c.d_model = 48;
    c.d_ff = 96;
    return c;
  }
  if (name == "llama-6h-kv1-bias") {  // one kv head replicated at tp 3; biases; tied embeddings
    ModelConfig c = test_model("llama-6h-kv3");
    c.name = name;
    c.n_kv_head = 1;
    c.bias = true;
    c.tied_embeddings = true;
    return c;
  }
  if (name == "llama-kv1-bias") {  // one kv head, replicated on every tp rank; biases
    ModelConfig c = model_preset("llama-tiny");
    c.name = name;
    c.n_kv_head = 1;
    c.bias = true;
    return c;
  }
  if (name == "gpt2-swiglu-rope") {  // the gpt2 family with the llama switches
    ModelConfig c = model_preset("gpt2-tiny");
    c.name = name;
    c.mlp = MlpKind::kSwiglu;
    c.position = PositionKind::kRope;
    c.tied_embeddings = false;
    return c;
  }
  return model_preset(name);
}

// GoogleTest case names allow letters, digits and '_' only.
inline std::string test_case_name(std::string name) {
  for (char& ch : name) {
    if (ch == '-') ch = '_';
  }
  return name;
}

}  // namespace lattice::testing
