#include "core/json_field.h"

#include <cmath>

#include "core/error.h"

namespace lattice {
namespace {

using nlohmann::json;

// "a string (\"8\")": the found type and, when short, the value itself.
std::string found_text(const json& value) {
  const std::string type = value.type_name();
  const std::string article = type == "array" || type == "object" ? "an " : "a ";
  const std::string text = value.dump();
  if (value.is_structured() || text.size() > 40) return article + type;
  return article + type + " (" + text + ")";
}

}  // namespace

JsonField::JsonField(const nlohmann::json& value, std::string origin, std::string hint)
    : value_(&value), origin_(std::move(origin)), hint_(std::move(hint)) {}

JsonField::JsonField(const nlohmann::json& value, const JsonField& parent, std::string path)
    : value_(&value), origin_(parent.origin_), hint_(parent.hint_), path_(std::move(path)) {}

void JsonField::wrong_type(std::string_view expected) const {
  const std::string where = path_.empty() ? "the document" : "'" + path_ + "'";
  LATTICE_THROW(ConfigError, "{}: {} is {}, expected {} ---> HINT: {}", origin_, where,
                found_text(*value_), expected, hint_);
}

std::optional<JsonField> JsonField::find(std::string_view key) const {
  if (!value_->is_object()) wrong_type("an object");
  const auto it = value_->find(key);
  if (it == value_->end()) return std::nullopt;
  return JsonField(*it, *this, path_.empty() ? std::string(key) : path_ + "." + std::string(key));
}

JsonField JsonField::operator[](std::string_view key) const {
  std::optional<JsonField> member = find(key);
  if (!member) {
    LATTICE_THROW(ConfigError, "{}: missing key '{}' ---> HINT: {}", origin_,
                  path_.empty() ? std::string(key) : path_ + "." + std::string(key), hint_);
  }
  return *member;
}

std::vector<JsonField> JsonField::elements() const {
  if (!value_->is_array()) wrong_type("an array");
  std::vector<JsonField> out;
  out.reserve(value_->size());
  for (size_t i = 0; i < value_->size(); ++i) {
    out.push_back(JsonField((*value_)[i], *this, path_ + "[" + std::to_string(i) + "]"));
  }
  return out;
}

double JsonField::number() const {
  if (!value_->is_number()) wrong_type("a number");
  return value_->get<double>();
}

int64_t JsonField::integer() const {
  if (value_->is_number_unsigned()) {
    if (value_->get<uint64_t>() <= uint64_t(INT64_MAX)) return int64_t(value_->get<uint64_t>());
  } else if (value_->is_number_integer()) {
    return value_->get<int64_t>();
  } else if (value_->is_number_float()) {
    // Never a cast of 3e11 into a narrower type or of 2.5 into 2.
    const double d = value_->get<double>();
    if (std::trunc(d) == d && d >= -0x1p63 && d < 0x1p63) return int64_t(d);
  }
  wrong_type("an integer (a whole number of at most 2^63 - 1)");
}

std::string JsonField::string() const {
  if (!value_->is_string()) wrong_type("a string");
  return value_->get<std::string>();
}

bool JsonField::boolean() const {
  if (!value_->is_boolean()) wrong_type("a boolean (true or false)");
  return value_->get<bool>();
}

double JsonField::number_or(std::string_view key, double fallback) const {
  const std::optional<JsonField> member = find(key);
  return member && !member->is_null() ? member->number() : fallback;
}

int64_t JsonField::integer_or(std::string_view key, int64_t fallback) const {
  const std::optional<JsonField> member = find(key);
  return member && !member->is_null() ? member->integer() : fallback;
}

std::string JsonField::string_or(std::string_view key, const std::string& fallback) const {
  const std::optional<JsonField> member = find(key);
  return member && !member->is_null() ? member->string() : fallback;
}

bool JsonField::boolean_or(std::string_view key, bool fallback) const {
  const std::optional<JsonField> member = find(key);
  return member && !member->is_null() ? member->boolean() : fallback;
}

}  // namespace lattice
