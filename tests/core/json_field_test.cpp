// JsonField: every JSON reader's field access. A wrong type is a ConfigError naming the file,
// the key path, the type expected and the one found; an absent or null optional key takes its
// fallback; integers are never truncated.
#include "core/json_field.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace lattice {
namespace {

std::string error_of(const std::function<void()>& read) {
  try {
    read();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonField, AWrongTypeNamesTheFileThePathAndBothTypes) {
  const nlohmann::json doc = nlohmann::json::parse(
      R"({"a": {"list": [{"n": 1}, {"n": "2"}]}, "flag": 1, "name": 7, "x": [1]})");
  const JsonField root(doc, "f.json", "fix it");
  EXPECT_EQ(root["a"]["list"].elements()[0]["n"].integer(), 1);
  EXPECT_EQ(error_of([&] { root["a"]["list"].elements()[1]["n"].integer(); }),
            "f.json: 'a.list[1].n' is a string (\"2\"), expected an integer (a whole number of at "
            "most 2^63 - 1) ---> HINT: fix it");
  EXPECT_NE(error_of([&] {
              root["flag"].boolean();
            }).find("'flag' is a number (1), expected a boolean (true or false)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { root.string_or("name", ""); }).find("'name' is a number (7)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { root["x"].number(); }).find("'x' is an array, expected a number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { root["missing"]; }).find("f.json: missing key 'missing'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { root["a"]["list"]["n"]; })
                .find("'a.list' is an array, expected an "
                      "object"),
            std::string::npos);
}

TEST(JsonField, OptionalKeysTakeTheirFallbackWhenAbsentOrNull) {
  const nlohmann::json doc = nlohmann::json::parse(R"({"null": null, "n": 4})");
  const JsonField root(doc, "f.json", "fix it");
  EXPECT_EQ(root.integer_or("absent", 9), 9);
  EXPECT_EQ(root.integer_or("null", 9), 9);
  EXPECT_EQ(root.integer_or("n", 9), 4);
  EXPECT_EQ(root.number_or("n", 0.5), 4.0);
  EXPECT_TRUE(root.boolean_or("null", true));
  EXPECT_FALSE(root.has("absent"));
  EXPECT_TRUE(root.has("null"));
}

TEST(JsonField, IntegersAreWholeAndInRange) {
  const nlohmann::json doc = nlohmann::json::parse(
      R"({"whole": 8.0, "half": 2.5, "huge": 3e30, "big": 18446744073709551615})");
  const JsonField root(doc, "f.json", "fix it");
  EXPECT_EQ(root["whole"].integer(), 8);
  for (const char* key : {"half", "huge", "big"}) {
    EXPECT_NE(error_of([&] { root[key].integer(); }).find("expected an integer"), std::string::npos)
        << key;
  }
}

}  // namespace
}  // namespace lattice
