#include "topology/cluster_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "topology/tree_plan.h"

namespace deltacast::topology {
namespace {

using ::testing::HasSubstr;

constexpr std::string_view kFile = "test.toml";

// The 1-based line of the first line of `text` that contains `needle`.
int LineOf(std::string_view text, std::string_view needle) {
  const size_t at = text.find(needle);
  EXPECT_NE(at, std::string_view::npos) << needle;
  int line = 1;
  for (size_t i = 0; i < at; ++i) line += text[i] == '\n' ? 1 : 0;
  return line;
}

std::string At(int line) { return std::string(kFile) + ":" + std::to_string(line) + ":"; }

// Parses `text`, expects kInvalidArgument, and returns the message.
std::string ErrorOf(std::string_view text) {
  Result<ClusterConfig> r = ParseClusterConfig(text, kFile);
  EXPECT_FALSE(r.ok()) << "parsed unexpectedly:\n" << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  return r.status().message();
}

// Expects the error to point at the first line containing `line_of` and to mention
// each of `mentions`.
void ExpectError(std::string_view text, std::string_view line_of,
                 std::initializer_list<std::string_view> mentions) {
  const std::string message = ErrorOf(text);
  EXPECT_THAT(message, HasSubstr(At(LineOf(text, line_of)))) << text;
  for (std::string_view m : mentions) EXPECT_THAT(message, HasSubstr(std::string(m))) << text;
}

constexpr std::string_view kHead = R"([cluster]
name = "t"
)";

constexpr std::string_view kTwoNodes = R"(
[[node]]
id = "src"
host = "127.0.0.1"
port = 7600
role = "source"

[[node]]
id = "r1"
host = "127.0.0.1"
port = 7601
)";

std::string WithHead(std::string_view rest) { return std::string(kHead) + std::string(rest); }

TEST(ClusterConfigTest, MinimalConfigGetsDocumentedDefaults) {
  Result<ClusterConfig> r = ParseClusterConfig(WithHead(kTwoNodes), kFile);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ClusterConfig& c = *r;
  EXPECT_EQ(c.name, "t");
  EXPECT_EQ(c.auth_token_env, "DELTACAST_TOKEN");
  EXPECT_EQ(c.source_file, std::filesystem::path(kFile));
  EXPECT_FALSE(c.tree.fanout.has_value());
  EXPECT_EQ(c.tree.chunk_size, 4u << 20);
  EXPECT_EQ(c.tree.window, 8);
  EXPECT_EQ(c.tree.commit_policy, CommitPolicy::kAll);
  EXPECT_EQ(c.tree.hop_latency.count(), 1);
  EXPECT_EQ(c.tree.connect_timeout.count(), 10'000);
  EXPECT_EQ(c.tree.idle_timeout.count(), 30'000);
  EXPECT_EQ(c.tree.commit_timeout.count(), 120'000);
  ASSERT_EQ(c.nodes.size(), 2u);
  const NodeConfig* r1 = c.FindNode("r1");
  ASSERT_NE(r1, nullptr);
  EXPECT_EQ(r1->role, Role::kReceiver);
  EXPECT_EQ(r1->region, "default");  // the source's region, which defaults too
  EXPECT_DOUBLE_EQ(r1->uplink_bps, 10e9);
  EXPECT_EQ(r1->transports, std::vector<std::string>{"tcp"});
  EXPECT_FALSE(r1->parent.has_value());
  EXPECT_EQ(r1->line, LineOf(WithHead(kTwoNodes), "[[node]]\nid = \"r1\""));
  EXPECT_EQ(c.Source()->id, "src");
  EXPECT_EQ(c.FindNode("nope"), nullptr);
}

TEST(ClusterConfigTest, EveryKeyIsRead) {
  const std::string text = R"([cluster]
name = "full"
auth_token_env = "MY_TOKEN"

[tree]
fanout = 3
chunk_size = "512KiB"
window = 4
commit_policy = "available"
hop_latency = "2ms"
connect_timeout = "5s"
idle_timeout = "1m"
commit_timeout = "300s"
default_uplink = "25Gbit"

[[region]]
name = "eu-west"
wan_bandwidth = "1Gbit"
wan_latency = "80ms"

[[node]]
id = "trainer"
host = "10.0.0.1"
port = 7600
region = "us-east"
role = "source"
uplink = "100Gbit"
transports = ["ucx", "tcp"]

[[node]]
id = "eu.1"
host = "10.1.0.1"
port = 7600
region = "eu-west"

[[node]]
id = "us_2"
host = "10.0.0.2"
port = 7600
parent = "eu.1"
)";
  Result<ClusterConfig> r = ParseClusterConfig(text, kFile);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ClusterConfig& c = *r;
  EXPECT_EQ(c.auth_token_env, "MY_TOKEN");
  EXPECT_EQ(c.tree.fanout, 3);
  EXPECT_EQ(c.tree.chunk_size, 512u << 10);
  EXPECT_EQ(c.tree.window, 4);
  EXPECT_EQ(c.tree.commit_policy, CommitPolicy::kAvailable);
  EXPECT_EQ(c.tree.hop_latency.count(), 2);
  EXPECT_EQ(c.tree.connect_timeout.count(), 5'000);
  EXPECT_EQ(c.tree.idle_timeout.count(), 60'000);
  EXPECT_EQ(c.tree.commit_timeout.count(), 300'000);
  ASSERT_EQ(c.regions.size(), 1u);
  EXPECT_EQ(c.regions[0].name, "eu-west");
  EXPECT_DOUBLE_EQ(c.regions[0].wan_bps, 1e9);
  EXPECT_EQ(c.regions[0].wan_latency.count(), 80);
  EXPECT_EQ(c.regions[0].line, LineOf(text, "[[region]]"));
  const NodeConfig* trainer = c.FindNode("trainer");
  EXPECT_DOUBLE_EQ(trainer->uplink_bps, 100e9);
  EXPECT_EQ(trainer->transports, (std::vector<std::string>{"ucx", "tcp"}));
  EXPECT_DOUBLE_EQ(c.FindNode("eu.1")->uplink_bps, 25e9);  // [tree] default_uplink
  const NodeConfig* us2 = c.FindNode("us_2");
  EXPECT_EQ(us2->region, "us-east");
  EXPECT_EQ(us2->parent, "eu.1");
  EXPECT_EQ(us2->parent_line, LineOf(text, "parent ="));
}

TEST(ClusterConfigTest, SyntaxErrorGivesLineAndColumn) {
  const std::string text = WithHead("[tree]\nwindow = = 3\n");
  const std::string message = ErrorOf(text);
  EXPECT_THAT(message, HasSubstr(At(LineOf(text, "window = = 3"))));
  EXPECT_THAT(message, HasSubstr("TOML syntax error"));
}

TEST(ClusterConfigTest, DuplicateKeyIsASyntaxError) {
  const std::string text = WithHead("name = \"again\"\n") + std::string(kTwoNodes);
  EXPECT_THAT(ErrorOf(text), HasSubstr("TOML syntax error"));
}

TEST(ClusterConfigTest, UnknownKeysAreErrorsAtEveryLevel) {
  ExpectError(WithHead(std::string(kTwoNodes) + "\n[trees]\nfanout = 2\n"), "[trees]",
              {"\"trees\"", "the top level", "did you mean \"tree\""});
  ExpectError(WithHead("[tree]\nfanuot = 2\n" + std::string(kTwoNodes)), "fanuot",
              {"\"fanuot\"", "[tree]", "did you mean \"fanout\""});
  ExpectError(WithHead("[tree]\nsomething_else = 2\n" + std::string(kTwoNodes)), "something_else",
              {"\"something_else\"", "known keys"});
  ExpectError(R"([cluster]
name = "t"
colour = "blue"
)" + std::string(kTwoNodes),
              "colour", {"\"colour\"", "[cluster]"});
  ExpectError(WithHead(std::string(kTwoNodes) + "uplnk = \"1Gbit\"\n"), "uplnk",
              {"\"uplnk\"", "[[node]]", "did you mean \"uplink\""});
  ExpectError(WithHead(std::string(kTwoNodes) +
                       "\n[[region]]\nname = \"x\"\nwan_bandwidth = \"1Gbit\"\nwan_latency = "
                       "\"1ms\"\nwan_jitter = \"1ms\"\n"),
              "wan_jitter", {"\"wan_jitter\"", "[[region]]"});
}

TEST(ClusterConfigTest, TokenInTheFileIsRefusedWithAHint) {
  ExpectError(R"([cluster]
name = "t"
auth_token = "s3cret"
)" + std::string(kTwoNodes),
              "auth_token", {"\"auth_token\"", "environment variable"});
  ExpectError(R"([cluster]
name = "t"
auth_token_env = "not a name"
)" + std::string(kTwoNodes),
              "auth_token_env", {"auth_token_env", "\"not a name\""});
}

TEST(ClusterConfigTest, MissingRequiredFields) {
  {
    const std::string message = ErrorOf(kTwoNodes);
    EXPECT_THAT(message, HasSubstr("test.toml: missing required table [cluster]"));
  }
  ExpectError("[cluster]\nauth_token_env = \"X\"\n" + std::string(kTwoNodes), "[cluster]",
              {"[cluster]", "\"name\""});
  {
    const std::string message = ErrorOf(kHead);
    EXPECT_THAT(message, HasSubstr("test.toml: no [[node]] entries"));
  }
  const std::string no_port = WithHead(R"(
[[node]]
id = "src"
host = "h"
role = "source"
)");
  ExpectError(no_port, "[[node]]", {"[[node]] \"src\"", "missing required key \"port\""});
  ExpectError(WithHead("\n[[node]]\nhost = \"h\"\nport = 1\n"), "[[node]]", {"\"id\""});
  ExpectError(WithHead("\n[[node]]\nid = \"s\"\nport = 1\n"), "[[node]]", {"\"host\""});
  ExpectError(WithHead(std::string(kTwoNodes) +
                       "region = \"eu\"\n\n[[region]]\nname = \"eu\"\nwan_latency = \"1ms\"\n"),
              "[[region]]", {"[[region]] \"eu\"", "\"wan_bandwidth\""});
}

TEST(ClusterConfigTest, WrongTypes) {
  ExpectError(WithHead(R"(
[[node]]
id = "src"
host = "h"
port = "7600"
role = "source"
)"),
              "port = \"7600\"", {"port", "must be an integer", "a string"});
  ExpectError(WithHead("[tree]\nwindow = 8.5\n" + std::string(kTwoNodes)), "window = 8.5",
              {"window", "an integer", "a float"});
  ExpectError(WithHead("[tree]\nfanout = true\n" + std::string(kTwoNodes)), "fanout = true",
              {"fanout", "a boolean"});
  ExpectError(WithHead(std::string(kTwoNodes) + "transports = \"tcp\"\n"), "transports",
              {"transports", "an array"});
  ExpectError(WithHead(std::string(kTwoNodes) + "transports = [1]\n"), "transports",
              {"transports", "strings"});
  ExpectError(WithHead(std::string(kTwoNodes) + "uplink = 10\n"), "uplink = 10",
              {"uplink", "a bandwidth"});
  ExpectError(WithHead("[tree]\nhop_latency = 5\n" + std::string(kTwoNodes)), "hop_latency",
              {"hop_latency", "a duration"});
  ExpectError("tree = 3\n" + WithHead(kTwoNodes), "tree = 3", {"\"tree\"", "table"});
  ExpectError(WithHead("\n[node]\nid = \"src\"\nhost = \"h\"\nport = 1\n"), "[node]", {"[[node]]"});
}

TEST(ClusterConfigTest, DuplicateNodeIdsAndAddresses) {
  const std::string dup_id = WithHead(std::string(kTwoNodes) + R"(
[[node]]
id = "r1"
host = "127.0.0.1"
port = 7602
)");
  const std::string message = ErrorOf(dup_id);
  EXPECT_THAT(
      message,
      HasSubstr(At(LineOf(dup_id, "[[node]]\nid = \"r1\"\nhost = \"127.0.0.1\"\nport = 7602"))));
  EXPECT_THAT(message, HasSubstr("id = \"r1\""));
  EXPECT_THAT(message,
              HasSubstr("line " + std::to_string(LineOf(dup_id, "[[node]]\nid = \"r1\""))));

  const std::string dup_address = WithHead(std::string(kTwoNodes) + R"(
[[node]]
id = "r2"
host = "127.0.0.1"
port = 7601
)");
  ExpectError(dup_address, "[[node]]\nid = \"r2\"", {"\"r2\"", "127.0.0.1:7601", "\"r1\""});
  // Host names compare case-insensitively.
  ExpectError(WithHead(R"(
[[node]]
id = "src"
host = "Node-A"
port = 7600
role = "source"

[[node]]
id = "r1"
host = "node-a"
port = 7600
)"),
              "[[node]]\nid = \"r1\"", {"node-a:7600"});
}

TEST(ClusterConfigTest, ExactlyOneSource) {
  const std::string none = WithHead(R"(
[[node]]
id = "a"
host = "h"
port = 1
)");
  EXPECT_THAT(ErrorOf(none), HasSubstr("test.toml: no [[node]] has role = \"source\""));
  const std::string two = WithHead(std::string(kTwoNodes) + R"(
[[node]]
id = "src2"
host = "h2"
port = 1
role = "source"
)");
  ExpectError(two, "[[node]]\nid = \"src2\"", {"\"src2\"", "role = \"source\"", "\"src\""});
  ExpectError(WithHead(std::string(kTwoNodes) + "role = \"relay\"\n"), "role = \"relay\"",
              {"role = \"relay\"", "\"source\", \"receiver\" or \"sender\""});
}

TEST(ClusterConfigTest, PortRange) {
  for (std::string_view port : {"0", "65536", "70000", "-1"}) {
    const std::string text = WithHead(std::string(kTwoNodes) +
                                      "\n[[node]]\nid = \"x\"\nhost = "
                                      "\"h\"\nport = " +
                                      std::string(port) + "\n");
    ExpectError(text, "port = " + std::string(port) + "\n",
                {"port = " + std::string(port), "out of range [1, 65535]"});
  }
}

TEST(ClusterConfigTest, UnparsableUnits) {
  ExpectError(WithHead("[tree]\nchunk_size = \"4 MB/s\"\n" + std::string(kTwoNodes)), "chunk_size",
              {"[tree] chunk_size", "\"4 MB/s\""});
  ExpectError(WithHead("[tree]\nchunk_size = \"1KiB\"\n" + std::string(kTwoNodes)), "chunk_size",
              {"chunk_size", "out of range"});
  ExpectError(WithHead(std::string(kTwoNodes) + "uplink = \"10GB\"\n"), "uplink",
              {"uplink", "\"10GB\"", "unknown unit"});
  ExpectError(WithHead("[tree]\nidle_timeout = \"30\"\n" + std::string(kTwoNodes)), "idle_timeout",
              {"idle_timeout", "\"30\""});
  ExpectError(WithHead("[tree]\ncommit_timeout = \"0s\"\n" + std::string(kTwoNodes)),
              "commit_timeout", {"commit_timeout", "greater than zero"});
  ExpectError(WithHead("[tree]\ndefault_uplink = \"0Gbit\"\n" + std::string(kTwoNodes)),
              "default_uplink", {"default_uplink", "greater than zero"});
}

TEST(ClusterConfigTest, FanoutWindowAndCommitPolicy) {
  ExpectError(WithHead("[tree]\nfanout = \"many\"\n" + std::string(kTwoNodes)), "fanout",
              {"fanout = \"many\"", "\"auto\" or an integer"});
  ExpectError(WithHead("[tree]\nfanout = 0\n" + std::string(kTwoNodes)), "fanout",
              {"fanout = 0", "out of range"});
  ExpectError(WithHead("[tree]\nwindow = 0\n" + std::string(kTwoNodes)), "window",
              {"window = 0", "out of range"});
  ExpectError(WithHead("[tree]\ncommit_policy = \"most\"\n" + std::string(kTwoNodes)),
              "commit_policy", {"commit_policy = \"most\"", "\"all\" or \"available\""});
}

TEST(ClusterConfigTest, NodeAndRegionNames) {
  ExpectError(
      WithHead(std::string(kTwoNodes) + "\n[[node]]\nid = \"bad id\"\nhost = \"h\"\nport = 1\n"),
      "bad id", {"id = \"bad id\"", "not a valid node id"});
  ExpectError(WithHead(std::string(kTwoNodes) + "\n[[node]]\nid = \"\"\nhost = \"h\"\nport = 1\n"),
              "id = \"\"", {"id = \"\""});
  ExpectError(WithHead(std::string(kTwoNodes) + "region = \"eu/west\"\n"), "eu/west",
              {"region = \"eu/west\""});
  ExpectError(
      WithHead(std::string(kTwoNodes) + "\n[[node]]\nid = \"x\"\nhost = \"a b\"\nport = 1\n"),
      "host = \"a b\"", {"host = \"a b\""});
  ExpectError(WithHead(std::string(kTwoNodes) + "transports = [\"rdma\"]\n"), "transports",
              {"\"rdma\""});
  ExpectError(WithHead(std::string(kTwoNodes) + "transports = [\"tcp\", \"tcp\"]\n"), "transports",
              {"twice"});
}

TEST(ClusterConfigTest, RegionsMustBeDeclaredAndUsed) {
  // A node outside the source's region needs [[region]] figures (and a typo is caught).
  ExpectError(WithHead(std::string(kTwoNodes) + "region = \"eu-wset\"\n"), "[[node]]\nid = \"r1\"",
              {"region = \"eu-wset\"", "no [[region]] entry"});
  // A declared region nobody uses is an error too: most likely a misspelling.
  const std::string unused = WithHead(std::string(kTwoNodes) + R"(
[[region]]
name = "eu-west"
wan_bandwidth = "1Gbit"
wan_latency = "80ms"
)");
  ExpectError(unused, "[[region]]", {"name = \"eu-west\"", "not used"});
  const std::string twice = WithHead(std::string(kTwoNodes) + R"(region = "eu"
[[region]]
name = "eu"
wan_bandwidth = "1Gbit"
wan_latency = "80ms"

[[region]]
name = "eu"
wan_bandwidth = "2Gbit"
wan_latency = "80ms"
)");
  const std::string message = ErrorOf(twice);
  EXPECT_THAT(message,
              HasSubstr(At(LineOf(twice, "[[region]]\nname = \"eu\"\nwan_bandwidth = \"2Gbit\""))));
  EXPECT_THAT(message, HasSubstr("already declared"));
}

TEST(ClusterConfigTest, ManualParents) {
  const std::string chain = std::string(kHead) + R"(
[[node]]
id = "src"
host = "h"
port = 1
role = "source"

[[node]]
id = "a"
host = "h"
port = 2
parent = "b"

[[node]]
id = "b"
host = "h"
port = 3
parent = "c"

[[node]]
id = "c"
host = "h"
port = 4
)";
  ASSERT_TRUE(ParseClusterConfig(chain, kFile).ok());

  auto replace = [](std::string text, std::string_view from, std::string_view to) {
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  ExpectError(replace(chain, "parent = \"b\"", "parent = \"zz\""), "parent = \"zz\"",
              {"[[node]] \"a\"", "parent = \"zz\"", "not a node"});
  ExpectError(replace(chain, "parent = \"b\"", "parent = \"a\""), "parent = \"a\"",
              {"parent = \"a\"", "itself"});
  ExpectError(replace(chain, "role = \"source\"", "role = \"source\"\nparent = \"c\""),
              "parent = \"c\"\n\n[[node]]\nid = \"a\"",
              {"\"src\"", "source", "cannot have a parent"});
  // b -> c -> b is a cycle; a hangs below it. The cycle is reported, at b.
  const std::string cycle = replace(chain, "port = 4\n", "port = 4\nparent = \"b\"\n");
  ExpectError(cycle, "parent = \"c\"", {"[[node]] \"b\"", "cycle", "b -> c -> b"});
}

TEST(ClusterConfigTest, UnreachableNodesAreReported) {
  // Built in code: a cycle whose members Validate reaches through a node below it.
  ClusterConfig config = *ParseClusterConfig(WithHead(kTwoNodes), kFile);
  NodeConfig x;
  x.id = "x";
  x.host = "h";
  x.port = 9;
  x.region = "default";
  x.uplink_bps = 1e9;
  x.transports = {"tcp"};
  x.parent = "y";
  x.line = 40;
  x.parent_line = 44;
  NodeConfig y = x;
  y.id = "y";
  y.port = 10;
  y.parent = "z";
  y.line = 50;
  y.parent_line = 54;
  NodeConfig z = y;
  z.id = "z";
  z.port = 11;
  z.parent = "y";
  z.line = 60;
  z.parent_line = 64;
  config.nodes.push_back(x);
  config.nodes.push_back(y);
  config.nodes.push_back(z);
  Status s = ValidateClusterConfig(config);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("test.toml:54:"));  // the cycle first
  EXPECT_THAT(s.message(), HasSubstr("y -> z -> y"));
  EXPECT_FALSE(PlanTree(config).ok());

  // The same cycle, but where it cannot even be reported as one: x below it only.
  config.nodes.pop_back();
  config.nodes.back().parent = "x";  // y -> x -> y, x listed first
  s = ValidateClusterConfig(config);
  EXPECT_THAT(s.message(), HasSubstr("test.toml:44:"));
  EXPECT_THAT(s.message(), HasSubstr("cycle"));

  config.nodes.back().parent = "r1";  // y -> r1: fine again
  EXPECT_TRUE(ValidateClusterConfig(config).ok()) << ValidateClusterConfig(config).ToString();
  config.nodes.back().parent = "y";
  config.nodes.back().line = 70;
  config.nodes.back().parent_line = 0;  // no parent line: falls back to the node's line
  s = ValidateClusterConfig(config);
  EXPECT_THAT(s.message(), HasSubstr("test.toml:70:"));
}

TEST(ClusterConfigTest, NodeBelowACycleIsUnreachable) {
  const std::string text = std::string(kHead) + R"(
[[node]]
id = "src"
host = "h"
port = 1
role = "source"

[[node]]
id = "leaf"
host = "h"
port = 2
parent = "p"

[[node]]
id = "p"
host = "h"
port = 3
parent = "q"

[[node]]
id = "q"
host = "h"
port = 4
parent = "p"
)";
  // The loop p -> q -> p is what gets reported, even though "leaf" comes first.
  ExpectError(text, "parent = \"q\"", {"[[node]] \"p\"", "p -> q -> p"});
}

TEST(ClusterConfigTest, ReadAuthToken) {
  ClusterConfig config = *ParseClusterConfig(WithHead(kTwoNodes), kFile);
  config.auth_token_env = "DELTACAST_TOPOLOGY_TEST_TOKEN";
  ::unsetenv("DELTACAST_TOPOLOGY_TEST_TOKEN");
  Result<std::string> r = ReadAuthToken(config);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("DELTACAST_TOPOLOGY_TEST_TOKEN is not set"));
  EXPECT_THAT(r.status().message(), HasSubstr("test.toml"));
  ::setenv("DELTACAST_TOPOLOGY_TEST_TOKEN", "", 1);
  EXPECT_THAT(ReadAuthToken(config).status().message(), HasSubstr("is empty"));
  ::setenv("DELTACAST_TOPOLOGY_TEST_TOKEN", "hunter2-but-longer", 1);
  ASSERT_TRUE(ReadAuthToken(config).ok());
  EXPECT_EQ(*ReadAuthToken(config), "hunter2-but-longer");
  ::unsetenv("DELTACAST_TOPOLOGY_TEST_TOKEN");
}

TEST(ClusterConfigTest, LoadFromFile) {
  Result<ClusterConfig> missing = LoadClusterConfig("/nonexistent/cluster.toml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  const std::filesystem::path path = std::filesystem::path(DELTACAST_CONFIGS_DIR) / "local-7.toml";
  Result<ClusterConfig> r = LoadClusterConfig(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->source_file, path);
}

TEST(ClusterConfigTest, ErrorsFromAFileNameIt) {
  const std::filesystem::path path =
      std::filesystem::path(::testing::TempDir()) / "topology_bad_config.toml";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    const std::string text = WithHead(std::string(kTwoNodes) + "port2 = 1\n");
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  Result<ClusterConfig> r = LoadClusterConfig(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(path.string() + ":14:"));
  std::filesystem::remove(path);
}

TEST(ClusterConfigTest, ExampleConfigsLoadAndPlan) {
  for (const char* name : {"local-7.toml", "three-regions.toml"}) {
    SCOPED_TRACE(name);
    Result<ClusterConfig> config =
        LoadClusterConfig(std::filesystem::path(DELTACAST_CONFIGS_DIR) / name);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    Result<TreePlan> plan = PlanTree(*config);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->nodes.size(), config->nodes.size());
  }
  ClusterConfig local =
      *LoadClusterConfig(std::filesystem::path(DELTACAST_CONFIGS_DIR) / "local-7.toml");
  EXPECT_EQ(local.nodes.size(), 8u);
  EXPECT_EQ(local.Source()->port, 7600);
  for (int i = 1; i <= 7; ++i) {
    const NodeConfig* n = local.FindNode("a" + std::to_string(i));
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->port, 7600 + i);
  }
  ClusterConfig three =
      *LoadClusterConfig(std::filesystem::path(DELTACAST_CONFIGS_DIR) / "three-regions.toml");
  EXPECT_EQ(three.regions.size(), 2u);
}

constexpr char kSourceAndReceiver[] =
    "[cluster]\nname = \"c\"\n[[node]]\nid = \"s\"\nhost = \"h\"\nport = 1\nrole = "
    "\"source\"\n[[node]]\nid = \"r\"\nhost = \"h\"\nport = 2\n";

TEST(ClusterConfigTest, LimitsHaveSafeDefaultsAndEachKeyIsRead) {
  auto config = ParseClusterConfig(kSourceAndReceiver, "c.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->limits.handshake_timeout, std::chrono::seconds(5));
  EXPECT_EQ(config->limits.max_pending_handshakes, 64);
  EXPECT_EQ(config->limits.max_handshakes_per_address, 8);
  EXPECT_EQ(config->limits.handshake_max_message, uint64_t{128} << 10);
  auto set = ParseClusterConfig(std::string(kSourceAndReceiver) +
                                    "[limits]\nhandshake_timeout = \"2s\"\n"
                                    "max_pending_handshakes = 10\nmax_handshakes_per_address = 2\n"
                                    "max_connections_per_address = 5\n"
                                    "handshake_max_message = \"1MiB\"\nreceive_pool = \"16MiB\"\n"
                                    "receive_pool_idle = \"500ms\"\n",
                                "c.toml");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->limits.handshake_timeout, std::chrono::seconds(2));
  EXPECT_EQ(set->limits.max_pending_handshakes, 10);
  EXPECT_EQ(set->limits.max_handshakes_per_address, 2);
  EXPECT_EQ(set->limits.max_connections_per_address, 5);
  EXPECT_EQ(set->limits.handshake_max_message, uint64_t{1} << 20);
  EXPECT_EQ(set->limits.receive_pool, uint64_t{16} << 20);
  EXPECT_EQ(set->limits.receive_pool_idle, std::chrono::milliseconds(500));
}

TEST(ClusterConfigTest, BadLimitsAreRefusedNamingTheKey) {
  for (const char* bad : {
           "[limits]\nhandshake_timeout = \"0s\"\n",
           "[limits]\nmax_pending_handshakes = 0\n",
           "[limits]\nhandshake_max_message = \"1KiB\"\n",  // below the largest HELLO
           "[limits]\nmax_pending_handshakes = 4\nmax_handshakes_per_address = 8\n",
           "[limits]\nhandshake_tmeout = \"1s\"\n",
       }) {
    auto config = ParseClusterConfig(std::string(kSourceAndReceiver) + bad, "c.toml");
    ASSERT_FALSE(config.ok()) << bad;
    EXPECT_NE(config.status().message().find("[limits]"), std::string::npos)
        << config.status().message();
    EXPECT_NE(config.status().message().find("c.toml:"), std::string::npos);
  }
}

TEST(ClusterConfigTest, SecurityPathsAreRelativeToTheConfigAndNameTheNode) {
  auto config = ParseClusterConfig(std::string(kSourceAndReceiver) +
                                       "[security]\nca = \"certs/ca.crt\"\n"
                                       "cert = \"certs/{node}.crt\"\nkey = \"/abs/{node}.key\"\n"
                                       "verify_key = \"certs/signing.pub\"\n",
                                   "/etc/deltacast/c.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const SecurityConfig& s = config->security;
  EXPECT_EQ(s.tls, TlsHops::kCrossRegion);
  EXPECT_EQ(s.ca, "/etc/deltacast/certs/ca.crt");
  EXPECT_EQ(s.CertFor("r"), "/etc/deltacast/certs/r.crt");
  EXPECT_EQ(s.KeyFor("s"), "/abs/s.key");
  EXPECT_EQ(s.verify_key, "/etc/deltacast/certs/signing.pub");
  EXPECT_TRUE(s.tls_files());
  for (const char* bad : {"[security]\nca = \"x\"\n",  // without cert and key
                          "[security]\ntls = \"some\"\n",
                          "[security]\nsigning_key = \"k\"\n",  // nodes could not verify
                          "[security]\ncert = \"\"\n"}) {
    auto c = ParseClusterConfig(std::string(kSourceAndReceiver) + bad, "c.toml");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find("[security]"), std::string::npos) << c.status().message();
  }
}

TEST(ClusterConfigTest, TlsCoversCrossRegionHopsByDefault) {
  NodeConfig a, b, c;
  a.region = b.region = "us";
  c.region = "eu";
  ClusterConfig config;
  EXPECT_FALSE(HopUsesTls(config, a, b));
  EXPECT_TRUE(HopUsesTls(config, a, c));
  config.security.tls = TlsHops::kAll;
  EXPECT_TRUE(HopUsesTls(config, a, b));
  config.security.tls = TlsHops::kNone;
  EXPECT_FALSE(HopUsesTls(config, a, c));
}

// Producers are not [[node]]s: for tls = "cross-region" they sit in the source's
// region (the trainer's network) unless [security] producer_region names another.
TEST(ClusterConfigTest, ProducersSitInTheSourcesRegionUnlessProducerRegionSaysOtherwise) {
  auto same = ParseClusterConfig(kSourceAndReceiver, "c.toml");
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(ProducerRegion(*same), same->Source()->region);
  EXPECT_FALSE(ProducerLinksUseTls(*same));
  same->security.tls = TlsHops::kAll;
  EXPECT_TRUE(ProducerLinksUseTls(*same));
  const std::string eu =
      std::string(kSourceAndReceiver) +
      "[[region]]\nname = \"eu\"\nwan_bandwidth = \"1Gbit\"\nwan_latency = \"1ms\"\n";
  auto away = ParseClusterConfig(eu + "[security]\nproducer_region = \"eu\"\n", "c.toml");
  ASSERT_TRUE(away.ok()) << away.status().ToString();
  EXPECT_EQ(ProducerRegion(*away), "eu");
  EXPECT_TRUE(ProducerLinksUseTls(*away));
  away->security.tls = TlsHops::kNone;
  EXPECT_FALSE(ProducerLinksUseTls(*away));
  // A misspelled region would quietly change which links encrypt: refused.
  auto typo = ParseClusterConfig(eu + "[security]\nproducer_region = \"ue\"\n", "c.toml");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("producer_region = \"ue\""), std::string::npos)
      << typo.status().message();
  auto empty = ParseClusterConfig(eu + "[security]\nproducer_region = \"\"\n", "c.toml");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("producer_region"), std::string::npos);
}

}  // namespace
}  // namespace deltacast::topology
