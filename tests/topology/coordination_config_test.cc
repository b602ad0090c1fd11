// [coordination] (topology/coordination_config.h): what the parser accepts, its
// defaults, and the errors that name the key and the value.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "topology/cluster_config.h"

namespace deltacast::topology {
namespace {

using ::testing::HasSubstr;

const std::string kNodes =
    "[[node]]\nid = \"s\"\nhost = \"127.0.0.1\"\nport = 7000\nrole = \"source\"\n";

Result<ClusterConfig> Parse(const std::string& coordination) {
  return ParseClusterConfig("[cluster]\nname = \"lab\"\n" + coordination + kNodes,
                            "/etc/deltacast/lab.toml");
}

std::string ErrorOf(const std::string& coordination) {
  auto r = Parse(coordination);
  EXPECT_FALSE(r.ok()) << coordination;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(CoordinationConfig, AbsentMeansNoCommitRecordStore) {
  auto r = Parse("");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->coordination.has_value());
}

TEST(CoordinationConfig, Defaults) {
  auto r = Parse("[coordination]\nendpoints = [\"http://10.0.0.1:2379\", \"https://e2:2379/\"]\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->coordination.has_value());
  const CoordinationConfig& c = *r->coordination;
  EXPECT_EQ(c.endpoints, (std::vector<std::string>{"http://10.0.0.1:2379", "https://e2:2379"}));
  EXPECT_EQ(c.prefix, "/deltacast");
  EXPECT_EQ(c.source_timeout, std::chrono::seconds(10));
  EXPECT_EQ(c.request_timeout, std::chrono::seconds(2));
  EXPECT_EQ(c.poll_interval, std::chrono::seconds(1));
  EXPECT_EQ(c.keep_records, 1000u);
  EXPECT_TRUE(c.ca_file.empty());
  EXPECT_TRUE(c.cert_file.empty());
  EXPECT_TRUE(c.key_file.empty());
}

TEST(CoordinationConfig, EveryKeySet) {
  auto r = Parse(
      "[coordination]\nendpoints = [\"https://10.0.0.1:2379\"]\nprefix = \"/prod/dc\"\n"
      "source_timeout = \"3s\"\nrequest_timeout = \"500ms\"\npoll_interval = \"250ms\"\n"
      "keep_records = 64\n"
      "ca_file = \"etcd/ca.crt\"\ncert_file = \"/abs/client.crt\"\nkey_file = \"client.key\"\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const CoordinationConfig& c = *r->coordination;
  EXPECT_EQ(c.prefix, "/prod/dc");
  EXPECT_EQ(c.source_timeout, std::chrono::seconds(3));
  EXPECT_EQ(c.request_timeout, std::chrono::milliseconds(500));
  EXPECT_EQ(c.poll_interval, std::chrono::milliseconds(250));
  EXPECT_EQ(c.keep_records, 64u);
  // Relative to the config file's folder.
  EXPECT_EQ(c.ca_file, "/etc/deltacast/etcd/ca.crt");
  EXPECT_EQ(c.cert_file, "/abs/client.crt");
  EXPECT_EQ(c.key_file, "/etc/deltacast/client.key");
}

TEST(CoordinationConfig, CredentialsInTheFileAreAnError) {
  for (const char* key : {"user", "password"}) {
    const std::string message = ErrorOf(
        std::string("[coordination]\nendpoints = [\"http://e:1\"]\n") + key + " = \"root\"\n");
    EXPECT_THAT(message, HasSubstr(std::string(key) + " must not be in the file"));
    EXPECT_THAT(message, HasSubstr("DELTACAST_ETCD_USER"));
    EXPECT_THAT(message, HasSubstr("DELTACAST_ETCD_PASSWORD"));
    EXPECT_THAT(message, HasSubstr("lab.toml:5:"));
  }
}

TEST(CoordinationConfig, BadValuesNameTheKey) {
  EXPECT_THAT(ErrorOf("[coordination]\nprefix = \"/x\"\n"),
              HasSubstr("missing required key endpoints"));
  EXPECT_THAT(ErrorOf("[coordination]\nendpoints = []\n"), HasSubstr("non-empty list"));
  EXPECT_THAT(ErrorOf("[coordination]\nendpoints = [\"10.0.0.1:2379\"]\n"),
              HasSubstr("\"10.0.0.1:2379\": each must be http://host:port"));
  EXPECT_THAT(ErrorOf("[coordination]\nendpoints = [\"http://e\"]\n"), HasSubstr("http://e"));
  EXPECT_THAT(ErrorOf("[coordination]\nendpoints = [\"http://e:1/v3\"]\n"),
              HasSubstr("http://e:1/v3"));
  EXPECT_THAT(ErrorOf("[coordination]\nendpoints = [\"http://e:1\"]\nprefix = \"deltacast\"\n"),
              HasSubstr("prefix = \"deltacast\" must start with /"));
  EXPECT_THAT(ErrorOf("[coordination]\nendpoints = [\"http://e:1\"]\nsource_timeout = \"500ms\"\n"),
              HasSubstr("source_timeout must be at least 1s"));
  EXPECT_THAT(ErrorOf("[coordination]\nendpoints = [\"http://e:1\"]\npoll_interval = \"0s\"\n"),
              HasSubstr("poll_interval must be greater than zero"));
  // Fewer than a restarted source reads would cut its lineage short.
  const std::string few =
      ErrorOf("[coordination]\nendpoints = [\"http://e:1\"]\nkeep_records = 63\n");
  EXPECT_THAT(few, HasSubstr("keep_records = 63 is below 64"));
  EXPECT_THAT(few, HasSubstr("lab.toml:5:"));
  EXPECT_THAT(ErrorOf("[coordination]\nendpoints = [\"http://e:1\"]\nkeep_records = \"1k\"\n"),
              HasSubstr("keep_records must be an integer"));
  EXPECT_THAT(ErrorOf("[coordination]\nendpoints = [\"http://e:1\"]\ncert_file = \"c.crt\"\n"),
              HasSubstr("cert_file and key_file go together"));
  EXPECT_THAT(ErrorOf("[coordination]\nendpoints = [\"http://e:1\"]\nendpoint = \"x\"\n"),
              HasSubstr("endpoint"));
}

}  // namespace
}  // namespace deltacast::topology
