// The planner's model-file readers (plan/model_file.h) on hostile text: each input is read
// both as a TOML model file and as a Hugging Face config.json.
#include "core/error.h"
#include "fuzz/fuzz_target.h"
#include "plan/model_file.h"

LATTICE_FUZZ_TARGET(model_file) {
  const std::string text(lattice::fuzz::as_text(input));
  try {
    (void)lattice::plan::parse_model_toml(text, "fuzz.toml");
  } catch (const lattice::ContractError&) {
    throw;
  } catch (const lattice::Error&) {
    // refused as documented; the JSON reader still gets the input
  }
  (void)lattice::plan::parse_model_hf_json(text, "fuzz.json");
}
