// The config reference cannot drift: docs/config.md documents exactly the keys the
// parser accepts, with the parser's defaults, and `deltacast config --explain`
// renders every key and parses back to the same config.
#include "topology/config_keys.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "topology/cluster_config.h"
#include "topology/config_explain.h"
#include "topology/units.h"

namespace deltacast::topology {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Trim(std::string s) {
  const size_t begin = s.find_first_not_of(' ');
  const size_t end = s.find_last_not_of(' ');
  return begin == std::string::npos ? "" : s.substr(begin, end - begin + 1);
}

// "`x`" -> "x" when the cell is one code span.
std::string Unquote(std::string cell) {
  if (cell.size() >= 2 && cell.front() == '`' && cell.back() == '`' &&
      cell.find('`', 1) == cell.size() - 1) {
    return cell.substr(1, cell.size() - 2);
  }
  return cell;
}

struct DocRow {
  std::string type, default_value;
};

// docs/config.md's key tables: "## [name]" or "## [[name]]" headings, then rows
// "| `key` | type | default | text |". Keyed by "table.key".
std::map<std::string, DocRow> DocumentedKeys(const std::string& doc,
                                             std::set<std::string>* tables) {
  std::map<std::string, DocRow> rows;
  std::istringstream lines(doc);
  std::string line, table;
  while (std::getline(lines, line)) {
    if (line.starts_with("## ")) {
      table.clear();
      const size_t open = line.find('[');
      if (open == std::string::npos) continue;
      const size_t start = line.find_first_not_of('[', open);
      table = line.substr(start, line.find(']', start) - start);
      tables->insert(table);
      continue;
    }
    if (table.empty() || !line.starts_with("| `")) continue;
    // Split on " | " (cells hold no such sequence; `\|` is an escaped bar).
    std::vector<std::string> cells;
    size_t at = 1;
    while (true) {
      size_t next = line.find(" | ", at);
      while (next != std::string::npos && next > 0 && line[next - 1] == '\\') {
        next = line.find(" | ", next + 1);
      }
      if (next == std::string::npos) break;
      cells.push_back(Trim(line.substr(at, next - at)));
      at = next + 2;
    }
    EXPECT_GE(cells.size(), 3u) << line;
    if (cells.size() < 3) continue;
    std::string type = cells[1];
    for (size_t p = type.find("\\|"); p != std::string::npos; p = type.find("\\|")) {
      type.replace(p, 2, "|");
    }
    std::string stripped;
    for (char c : type) {
      if (c != '`') stripped += c;
    }
    const std::string name = table + "." + Unquote(cells[0]);
    EXPECT_FALSE(rows.contains(name)) << name << " documented twice";
    rows[name] = DocRow{stripped, Unquote(cells[2])};
  }
  return rows;
}

TEST(ConfigReference, DocumentsEveryKeyTheParserAcceptsAndNoOther) {
  std::set<std::string> tables;
  const auto rows = DocumentedKeys(
      ReadText(std::filesystem::path(DELTACAST_SOURCE_DIR) / "docs/config.md"), &tables);
  for (const ConfigTable& t : ConfigTables()) {
    EXPECT_TRUE(tables.contains(std::string(t.name)))
        << "docs/config.md has no ## [" << t.name << "] section";
  }
  std::set<std::string> accepted;
  for (const ConfigKey& k : ConfigKeys()) {
    const std::string name = std::string(k.table) + "." + std::string(k.key);
    accepted.insert(name);
    const auto it = rows.find(name);
    if (it == rows.end()) {
      ADD_FAILURE() << "docs/config.md does not document [" << k.table << "] " << k.key;
      continue;
    }
    EXPECT_EQ(it->second.type, k.type) << name;
    EXPECT_EQ(it->second.default_value, k.required ? "required" : std::string(k.default_value))
        << name;
  }
  for (const auto& [name, row] : rows) {
    EXPECT_TRUE(accepted.contains(name))
        << "docs/config.md documents " << name << ", which the parser does not accept";
  }
}

// A config holding one entry of every table, each array-of-tables entry last in
// its array, so a key appended to a table lands in that entry.
struct ConfigText {
  std::map<std::string, std::vector<std::string>> lines;  // by table

  ConfigText() {
    lines["cluster"] = {"name = \"c\""};
    lines["region"] = {"name = \"far\"", "wan_bandwidth = \"1Gbit\"", "wan_latency = \"10ms\""};
    lines["node"] = {"id = \"n\"", "host = \"127.0.0.1\"", "port = 7001", "region = \"far\""};
    lines["link"] = {"transports = [\"tcp\"]"};
    lines["objstore"] = {"endpoint = \"http://127.0.0.1:1\"", "bucket = \"b\"",
                         "bridges = [\"n\"]"};
    lines["coordination"] = {"endpoints = [\"http://127.0.0.1:2379\"]"};
  }

  void Set(std::string_view table, std::string_view key, std::string_view value) {
    lines[std::string(table)].push_back(std::string(key) + " = " + std::string(value));
  }

  std::string Text() const {
    std::string out =
        "[[node]]\nid = \"s\"\nhost = \"127.0.0.1\"\nport = 7000\nrole = "
        "\"source\"\nregion = \"home\"\nuplink = \"1Gbit\"\ntransports = [\"tcp\"]\n";
    for (const ConfigTable& t : ConfigTables()) {
      const auto it = lines.find(std::string(t.name));
      if (it == lines.end()) continue;
      out += t.array ? "[[" + std::string(t.name) + "]]\n" : "[" + std::string(t.name) + "]\n";
      for (const std::string& l : it->second) out += l + "\n";
    }
    return out;
  }
};

// The explain output without its comments: what the config holds.
std::string Values(const std::string& explained) {
  std::istringstream lines(explained);
  std::string line, out;
  while (std::getline(lines, line)) {
    if (line.starts_with("#")) continue;
    if (const size_t at = line.find("  # "); at != std::string::npos) line.resize(at);
    out += Trim(line) + "\n";
  }
  return out;
}

std::string Explain(const std::string& text) {
  auto explained = ExplainClusterConfig(text, "/cfg/test.toml", ExplainFormat::kToml);
  EXPECT_TRUE(explained.ok()) << explained.status().ToString() << "\n" << text;
  return explained.ok() ? *explained : "";
}

TEST(ConfigReference, LiteralDefaultsAreTheParsersDefaults) {
  const std::string plain = Values(Explain(ConfigText().Text()));
  ASSERT_FALSE(plain.empty());
  int checked = 0;
  for (const ConfigKey& k : ConfigKeys()) {
    if (k.required || !k.default_literal) continue;
    ConfigText config;
    config.Set(k.table, k.key, k.default_value);
    EXPECT_EQ(Values(Explain(config.Text())), plain)
        << "[" << k.table << "] " << k.key << " = " << k.default_value
        << " is documented as the default but changes the config";
    ++checked;
  }
  EXPECT_GT(checked, 30);
}

TEST(ConfigReference, ExplainWritesEveryKeyAndParsesBack) {
  ConfigText config;
  for (const ConfigKey& k : ConfigKeys()) {
    if (k.required) continue;
    if (k.table == "node" && (k.key == "region")) continue;  // set above
    std::string value(k.default_value);
    if (k.table == "node" && k.key == "uplink") value = "\"2.5Gbit\"";
    if (k.table == "node" && k.key == "parent") value = "\"s\"";
    if (k.table == "region" && k.key == "flow_bandwidth") value = "\"500Mbit\"";
    if (k.table == "security" && k.key == "producer_region") value = "\"far\"";
    if (k.table == "security" && k.type == "path") value = "\"certs/" + std::string(k.key) + "\"";
    if (k.table == "objstore" && k.key == "prefix") value = "\"p\"";
    if (k.table == "coordination" && k.type == "path") {
      value = "\"etcd/" + std::string(k.key) + "\"";
    }
    if (k.key == "window") value = "16";
    if (k.key == "commit_timeout") value = "\"1500ms\"";
    if (k.key == "chunk_size") value = "4097";
    config.Set(k.table, k.key, value);
  }
  const std::string explained = Explain(config.Text());
  EXPECT_THAT(explained, Not(HasSubstr("  # default"))) << explained;
  // Every key of every table with a value (none left as a comment).
  std::istringstream lines(explained);
  std::string line, table;
  std::map<std::string, std::set<std::string>> seen;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    if (line.starts_with("[")) {
      table = line.substr(line.find_first_not_of('['));
      table.resize(table.find(']'));
    } else if (!line.starts_with("#")) {
      seen[table].insert(line.substr(0, line.find(" = ")));
    } else if (!table.empty() && !line.starts_with("# parent: ") &&  // the source has none
               !line.ends_with(": receivers only")) {
      ADD_FAILURE() << "[" << table << "] left a key without a value: " << line;
    }
  }
  for (const ConfigKey& k : ConfigKeys()) {
    EXPECT_TRUE(seen[std::string(k.table)].contains(std::string(k.key)))
        << "explain does not write [" << k.table << "] " << k.key;
  }
  EXPECT_THAT(explained, HasSubstr("ca = \"/cfg/certs/ca\""));
  EXPECT_THAT(explained, HasSubstr("chunk_size = \"4097B\""));
  EXPECT_THAT(explained, HasSubstr("commit_timeout = \"1500ms\""));
  EXPECT_THAT(explained, HasSubstr("uplink = \"2.5Gbit\""));
  // What it writes is a config, and the same one.
  EXPECT_EQ(Values(Explain(explained)), Values(explained));
}

TEST(ConfigReference, ExplainMarksDefaultsAndTheExamplesParseBack) {
  for (const char* name : {"local-7.toml", "three-regions.toml", "bucket-region.toml"}) {
    const std::filesystem::path path =
        std::filesystem::path(DELTACAST_SOURCE_DIR) / "configs" / name;
    auto explained = ExplainClusterConfigFile(path, ExplainFormat::kToml);
    ASSERT_TRUE(explained.ok()) << explained.status().ToString();
    EXPECT_EQ(Values(Explain(*explained)), Values(*explained)) << name;
  }
  const std::string minimal = ConfigText().Text();
  const std::string explained = Explain(minimal);
  EXPECT_THAT(explained, HasSubstr("window = 8"));
  EXPECT_THAT(explained, HasSubstr("# default"));
  EXPECT_THAT(explained, HasSubstr("# default: [tree] default_uplink"));
  EXPECT_THAT(explained, HasSubstr("# parent: the planner's choice"));

  auto as_json = ExplainClusterConfig(minimal, "/cfg/test.toml", ExplainFormat::kJson);
  ASSERT_TRUE(as_json.ok()) << as_json.status().ToString();
  const auto j = nlohmann::json::parse(*as_json);
  EXPECT_EQ(j["tree"]["window"], 8);
  EXPECT_EQ(j["tree"]["chunk_size"], "4MiB");
  EXPECT_EQ(j["node"].size(), 2u);
  EXPECT_EQ(j["node"][1]["uplink"], "10Gbit");
  EXPECT_TRUE(j["node"][1]["parent"].is_null());
  const auto& defaulted = j["defaulted"];
  EXPECT_NE(std::find(defaulted.begin(), defaulted.end(), "tree.window"), defaulted.end());
  EXPECT_NE(std::find(defaulted.begin(), defaulted.end(), "node[1].uplink"), defaulted.end());
  EXPECT_EQ(std::find(defaulted.begin(), defaulted.end(), "node[1].port"), defaulted.end());
}

TEST(ConfigReference, ExplainFailsAsTheParserDoesWithFileAndLine) {
  ConfigText config;
  config.Set("tree", "windw", "8");
  auto explained = ExplainClusterConfig(config.Text(), "bad.toml", ExplainFormat::kToml);
  ASSERT_FALSE(explained.ok());
  EXPECT_EQ(explained.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(explained.status().message(), HasSubstr("bad.toml:"));
  EXPECT_THAT(explained.status().message(), HasSubstr("did you mean \"window\""));
}

TEST(ConfigReference, EveryTableRefusesAKeyNotInTheList) {
  for (const ConfigTable& t : ConfigTables()) {
    ConfigText config;
    config.Set(t.name, "no_such_key_at_all", "1");
    auto r = ParseClusterConfig(config.Text(), "t.toml");
    ASSERT_FALSE(r.ok()) << t.name;
    EXPECT_THAT(r.status().message(), HasSubstr("no_such_key_at_all")) << t.name;
    EXPECT_THAT(r.status().message(), HasSubstr("t.toml:")) << t.name;
  }
}

TEST(ConfigReference, ReferenceListsEveryKey) {
  const std::string toml = ConfigReference(ExplainFormat::kToml);
  const auto j = nlohmann::json::parse(ConfigReference(ExplainFormat::kJson));
  EXPECT_EQ(j.size(), ConfigKeys().size());
  for (const ConfigKey& k : ConfigKeys()) {
    EXPECT_THAT(toml, HasSubstr(std::string(k.key) + " = ")) << k.key;
  }
  EXPECT_THAT(toml, HasSubstr("window = 8"));
  EXPECT_THAT(toml, HasSubstr("# name = (required)"));
}

TEST(ConfigReference, ExactUnitsParseBackToTheSameValue) {
  for (uint64_t bytes : {uint64_t{1}, uint64_t{4096}, uint64_t{4097}, uint64_t{3} << 30}) {
    EXPECT_EQ(*ParseSize(ExactSize(bytes)), bytes) << ExactSize(bytes);
  }
  EXPECT_EQ(ExactSize(uint64_t{4} << 20), "4MiB");
  for (double bps : {1.0, 2.5e9, 10e9, 123456789.0, 1.5e12}) {
    EXPECT_EQ(*ParseBandwidth(ExactBandwidth(bps)), bps) << ExactBandwidth(bps);
  }
  EXPECT_EQ(ExactBandwidth(10e9), "10Gbit");
  EXPECT_EQ(ExactDuration(std::chrono::milliseconds(120000)), "120s");
  EXPECT_EQ(ExactDuration(std::chrono::milliseconds(1500)), "1500ms");
}

}  // namespace
}  // namespace deltacast::topology
