// The commit record against an etcd that demands what production ones do: https on
// the client port (a certificate for 127.0.0.1 from a test CA), client certificates
// (--client-cert-auth) and users (auth enabled, root with a password). One member,
// started once for this binary. Credentials come only from the environment.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/hash.h"
#include "coord/etcd_client.h"
#include "coord/etcd_commit_records.h"
#include "tests/coord/etcd_cluster.h"
#include "tests/temp_dir.h"
#include "topology/cluster_config.h"

namespace deltacast::coord {
namespace {

using relay::CommitRecord;
using test_util::EtcdCluster;
using ::testing::HasSubstr;

constexpr const char* kPassword = "s3cret-for-tests";

EtcdCluster* g_etcd = nullptr;
bool g_wanted = false;  // etcd and openssl are there: a setup that failed is a failure
std::filesystem::path g_certs;

// A CA, a server certificate for IP 127.0.0.1 and a client certificate, with the
// openssl command line. Go, which etcd is written in, wants the IP in the SAN; etcd's
// gateway dials etcd's own gRPC port with the server certificate as its client
// certificate, so under --client-cert-auth that one needs clientAuth too. No
// CommonName: etcd 3.4's gateway refuses a client certificate that has one (HTTP 400,
// "CommonName of client sending a request against gateway will be ignored").
bool WriteCertificates(const std::filesystem::path& dir, const std::string& name) {
  const std::filesystem::path script = dir / (name + "make-certs.sh");
  std::ofstream(script) << "set -e\ncd \"$(dirname \"$0\")\"\n"
                        << "n=" << name << "\n"
                        << R"(ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $ec -keyout ${n}ca.key -out ${n}ca.crt -subj /CN=${n}test-ca -days 2 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > server.ext
printf 'extendedKeyUsage=clientAuth\n' > client.ext
for who in server client; do
  openssl req $ec -keyout ${n}$who.key -out $who.csr -subj /O=deltacast-$who 2>/dev/null
  openssl x509 -req -in $who.csr -CA ${n}ca.crt -CAkey ${n}ca.key -CAcreateserial \
    -out ${n}$who.crt -days 2 -extfile $who.ext 2>/dev/null
done
)";
  return std::system(("bash '" + script.string() + "'").c_str()) == 0;
}

class AuthEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!EtcdCluster::Available() || std::system("command -v openssl >/dev/null") != 0) return;
    g_wanted = true;
    dir_ = std::make_unique<test_util::TempDir>("deltacast-etcd-auth");
    g_certs = dir_->path() / "certs";
    std::filesystem::create_directories(g_certs);
    ASSERT_TRUE(WriteCertificates(g_certs, "")) << "openssl could not write certificates";
    ASSERT_TRUE(WriteCertificates(g_certs, "other-")) << "openssl could not write certificates";
    EtcdCluster::Tls tls{.cert = g_certs / "server.crt",
                         .key = g_certs / "server.key",
                         .ca = g_certs / "ca.crt",
                         .client_ca = g_certs / "ca.crt",
                         .client_cert = g_certs / "client.crt",
                         .client_key = g_certs / "client.key"};
    // Tokens that expire after a second, so a client must replace its own.
    cluster_ = std::make_unique<EtcdCluster>(dir_->path() / "etcd", 1, tls,
                                             std::vector<std::string>{"--auth-token-ttl=1"});
    ASSERT_TRUE(cluster_->Start());
    // What `etcdctl user add root; etcdctl auth enable` does, through the gateway.
    const std::string user = nlohmann::json{{"name", "root"}, {"password", kPassword}}.dump();
    for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
             {"/v3/auth/user/add", user},
             {"/v3/auth/role/add", R"({"name":"root"})"},
             {"/v3/auth/user/grant", R"({"user":"root","role":"root"})"},
             {"/v3/auth/enable", "{}"}}) {
      const std::string answer = cluster_->Post(0, path, body);
      ASSERT_THAT(answer, HasSubstr("\"header\"")) << path << ": " << answer;
    }
    g_etcd = cluster_.get();
  }
  void TearDown() override {
    g_etcd = nullptr;
    cluster_.reset();
    dir_.reset();
  }

 private:
  std::unique_ptr<test_util::TempDir> dir_;
  std::unique_ptr<EtcdCluster> cluster_;
};

const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new AuthEnvironment);

#define REQUIRE_ETCD()                                                                    \
  do {                                                                                    \
    if (g_wanted && !g_etcd) FAIL() << "the etcd of this binary did not start";           \
    if (!g_etcd) GTEST_SKIP() << EtcdCluster::kSkipMessage << " (or openssl is missing)"; \
  } while (false)

// A config whose [coordination] names the test etcd, with `extra` lines.
topology::ClusterConfig Config(const std::string& extra) {
  const std::string text = "[cluster]\nname = \"auth\"\n[coordination]\nendpoints = [\"" +
                           g_etcd->endpoint(0) + "\"]\n" + extra +
                           "[[node]]\nid = \"s\"\nhost = \"127.0.0.1\"\nport = 7000\n"
                           "role = \"source\"\n";
  auto config = topology::ParseClusterConfig(text, (g_certs / "c.toml").string());
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? *config : topology::ClusterConfig{};
}

const std::string kClientTls =
    "ca_file = \"ca.crt\"\ncert_file = \"client.crt\"\nkey_file = \"client.key\"\n";

CommitRecord Record(uint64_t refit) {
  Digest128 base, target;
  base.bytes.fill(1);
  target.bytes.fill(2);
  return CommitRecord{.cluster = "auth",
                      .refit_id = refit,
                      .base_version = base,
                      .target_version = target,
                      .commit = true,
                      .decided_by = "source"};
}

// Sets the credentials for one scope.
class Credentials {
 public:
  Credentials(const char* user, const char* password) {
    Set(topology::kEtcdUserEnv, user);
    Set(topology::kEtcdPasswordEnv, password);
  }
  ~Credentials() {
    ::unsetenv(topology::kEtcdUserEnv);
    ::unsetenv(topology::kEtcdPasswordEnv);
  }

 private:
  static void Set(const char* name, const char* value) {
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
};

Result<CommitRecord> DecideWith(const topology::ClusterConfig& config, uint64_t refit) {
  auto store = MakeCommitRecordStore(config);
  if (!store.ok()) return store.status();
  return (*store)->Decide(Record(refit));
}

TEST(EtcdAuth, CredentialsFromTheEnvironmentOverTls) {
  REQUIRE_ETCD();
  const auto config = Config(kClientTls);
  Credentials credentials("root", kPassword);
  auto decided = DecideWith(config, 1);
  ASSERT_TRUE(decided.ok()) << decided.status().ToString();
  auto store = MakeCommitRecordStore(config);
  ASSERT_TRUE(store.ok());
  auto read = (*store)->Read(1);
  ASSERT_TRUE(read.ok() && read->has_value()) << read.status().ToString();
  EXPECT_TRUE((*read)->commit);
  ASSERT_TRUE((*store)
                  ->Announce({.cluster = "auth",
                              .refit_id = 2,
                              .base_version = Record(2).base_version,
                              .target_version = Record(2).target_version,
                              .source_alive = true},
                             5)
                  .ok());
  ASSERT_TRUE((*store)->Renew(2).ok());
  auto undecided = (*store)->Undecided();
  ASSERT_TRUE(undecided.ok()) << undecided.status().ToString();
  EXPECT_EQ(undecided->size(), 1u);
}

TEST(EtcdAuth, AnExpiredTokenIsReplaced) {
  REQUIRE_ETCD();
  Credentials credentials("root", kPassword);
  auto store = MakeCommitRecordStore(Config(kClientTls));
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Decide(Record(5)).ok());
  // etcd drops a simple token once it has been idle for --auth-token-ttl.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  auto read = (*store)->Read(5);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(read->has_value());
}

TEST(EtcdAuth, MissingOrWrongCredentialsAreRefused) {
  REQUIRE_ETCD();
  const auto config = Config(kClientTls);
  {
    Credentials none(nullptr, nullptr);
    auto decided = DecideWith(config, 10);
    EXPECT_EQ(decided.status().code(), StatusCode::kPermissionDenied)
        << decided.status().ToString();
    EXPECT_THAT(decided.status().message(), HasSubstr(topology::kEtcdUserEnv));
  }
  {
    Credentials wrong("root", "not-the-password");
    auto decided = DecideWith(config, 10);
    EXPECT_EQ(decided.status().code(), StatusCode::kPermissionDenied)
        << decided.status().ToString();
    EXPECT_THAT(decided.status().message(), HasSubstr("refused user \"root\""));
  }
  {
    Credentials half("root", nullptr);
    EXPECT_EQ(DecideWith(config, 10).status().code(), StatusCode::kInvalidArgument);
  }
  // Nothing was written by any of them.
  Credentials right("root", kPassword);
  auto store = MakeCommitRecordStore(config);
  ASSERT_TRUE(store.ok());
  auto read = (*store)->Read(10);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_FALSE(read->has_value());
}

TEST(EtcdAuth, TlsProblemsMeanNothingWasSent) {
  REQUIRE_ETCD();
  Credentials credentials("root", kPassword);
  // No client certificate: etcd ends the handshake.
  auto decided = DecideWith(Config("ca_file = \"ca.crt\"\n"), 20);
  EXPECT_EQ(decided.status().code(), StatusCode::kUnavailable) << decided.status().ToString();
  // A server certificate from a CA we do not trust.
  decided = DecideWith(Config("ca_file = \"other-ca.crt\"\ncert_file = \"client.crt\"\n"
                              "key_file = \"client.key\"\n"),
                       20);
  EXPECT_EQ(decided.status().code(), StatusCode::kUnavailable) << decided.status().ToString();
  // A client certificate from a CA etcd does not trust.
  decided = DecideWith(Config("ca_file = \"ca.crt\"\ncert_file = \"other-client.crt\"\n"
                              "key_file = \"other-client.key\"\n"),
                       20);
  EXPECT_EQ(decided.status().code(), StatusCode::kUnavailable) << decided.status().ToString();
  // Plain http to an https port: no answer etcd could act on.
  std::string http = g_etcd->endpoint(0);
  http.replace(0, 5, "http");
  EtcdOptions o{.endpoints = {http},
                .request_timeout = std::chrono::seconds(1),
                .ca_file = "",
                .cert_file = "",
                .key_file = "",
                .user = "",
                .password = ""};
  auto client = EtcdClient::Create(o);
  ASSERT_TRUE(client.ok());
  EXPECT_FALSE((*client)->Range("/x").ok());

  auto store = MakeCommitRecordStore(Config(kClientTls));
  ASSERT_TRUE(store.ok());
  auto read = (*store)->Read(20);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_FALSE(read->has_value());
}

}  // namespace
}  // namespace deltacast::coord
