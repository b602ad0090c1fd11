// The one reader of the project's TOML files: FILE:LINE on every problem, a syntax
// error with its column, an unknown key with the nearest known one or the list.
#include "common/toml_text.h"

#include <gtest/gtest.h>

namespace deltacast::toml_text {
namespace {

constexpr std::string_view kKnown[] = {"window", "fanout", "chunk_size"};

TEST(TomlText, AnUnknownKeyNamesItsLineAndTheNearestKnownKey) {
  Reader reader("c.toml");
  auto root = reader.Parse("[tree]\nfanout = 2\nwindw = 4\n");
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  Status s = reader.CheckKeys(*(*root)["tree"].as_table(), "[tree]", kKnown);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "c.toml:3: unknown key \"windw\" in [tree] (did you mean \"window\"?)");
}

TEST(TomlText, AKeyFarFromEveryKnownOneListsThemAll) {
  Reader reader("c.toml");
  auto root = reader.Parse("something_else = 1\n");
  ASSERT_TRUE(root.ok());
  Status s = reader.CheckKeys(*root, "the top level", kKnown);
  EXPECT_EQ(s.message(),
            "c.toml:1: unknown key \"something_else\" in the top level (known keys: window "
            "fanout chunk_size)");
  EXPECT_TRUE(reader.CheckKeys(*Reader("x").Parse("window = 1\n"), "w", kKnown).ok());
}

TEST(TomlText, ASyntaxErrorNamesLineAndColumn) {
  auto root = Reader("c.toml").Parse("[tree\nfanout = 2\n");
  ASSERT_FALSE(root.ok());
  EXPECT_EQ(root.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(root.status().message().rfind("c.toml:1:", 0), 0u) << root.status().message();
  EXPECT_NE(root.status().message().find("TOML syntax error"), std::string::npos);
}

TEST(TomlText, ErrorsWithoutALineNameTheFileAlone) {
  EXPECT_EQ(Reader("c.toml").Error(0, "no [[node]] entries").message(),
            "c.toml: no [[node]] entries");
  EXPECT_EQ(EditDistance("fanuot", "fanout"), 2u);
  EXPECT_EQ(NearestKey("fanuot", kKnown), "fanout");
  EXPECT_TRUE(NearestKey("zzzzzz", kKnown).empty());
  EXPECT_EQ(TypeName(toml::node_type::array), "an array");
}

}  // namespace
}  // namespace deltacast::toml_text
