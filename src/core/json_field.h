// Reading a user's JSON file (a cluster profile, a model's config.json, a manifest, ...) field
// by field. A field of the wrong type is a ConfigError naming the file, the key path
// (`gpus_per_node`, `gemm[3].m`) and the expected and found types, with the reader's hint:
// never nlohmann's "[json.exception.type_error.302] type must be number" naming no key.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lattice {

class JsonField {
 public:
  // `origin` names the file in messages; `hint` is the fix every refusal ends with.
  JsonField(const nlohmann::json& value, std::string origin, std::string hint);

  // The member `key` of this object: ConfigError when this is no object or `key` is missing.
  JsonField operator[](std::string_view key) const;
  // The member `key`, or nullopt when it is absent (ConfigError when this is no object).
  std::optional<JsonField> find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key).has_value(); }
  bool is_null() const { return value_->is_null(); }
  // The elements of this array (ConfigError when this is no array), named `path[i]`.
  std::vector<JsonField> elements() const;

  double number() const;
  // A JSON integer, or a float with an integral value (8.0), within int64; never 2.5 as 2.
  int64_t integer() const;
  std::string string() const;
  bool boolean() const;

  // The optional member `key`, or `fallback` when it is absent or null (Hugging Face configs
  // write null for "the class default").
  double number_or(std::string_view key, double fallback) const;
  int64_t integer_or(std::string_view key, int64_t fallback) const;
  std::string string_or(std::string_view key, const std::string& fallback) const;
  bool boolean_or(std::string_view key, bool fallback) const;

  const nlohmann::json& raw() const { return *value_; }
  const std::string& path() const { return path_; }
  const std::string& origin() const { return origin_; }

  // ConfigError: this field is not `expected` ("a number", "an integer").
  [[noreturn]] void wrong_type(std::string_view expected) const;

 private:
  JsonField(const nlohmann::json& value, const JsonField& parent, std::string path);

  const nlohmann::json* value_;
  std::string origin_;
  std::string hint_;
  std::string path_;  // "" at the document's root
};

}  // namespace lattice
