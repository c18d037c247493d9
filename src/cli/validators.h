// Option validators whose messages read as sentences. CLI11's NonNegativeNumber and
// PositiveNumber report a bad value as "Value -3 not in range 0.000000 to 1797693134862315...
// (309 digits)": the upper end of a double.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>

namespace lattice::cli {

namespace validator_detail {

// Empty if `text` is a number that `accept` takes, else the message CLI11 puts after the
// option's name ("--tokens: must be 0 or more, got -3").
template <typename Accept>
std::string check_number(const std::string& text, Accept accept, const char* wanted) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) return "'" + text + "' is not a number";
  if (!accept(value)) return std::string("must be ") + wanted + ", got " + text;
  return {};
}

}  // namespace validator_detail

// A number >= 0.
inline CLI::Validator non_negative_number() {
  return CLI::Validator(
      [](std::string& text) {
        return validator_detail::check_number(
            text, [](double v) { return v >= 0; }, "0 or more");
      },
      "NONNEGATIVE", "NonNegative");
}

// A number > 0.
inline CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) {
        return validator_detail::check_number(
            text, [](double v) { return v > 0; }, "greater than 0");
      },
      "POSITIVE", "Positive");
}

}  // namespace lattice::cli
