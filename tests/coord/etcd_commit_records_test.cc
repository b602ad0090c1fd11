// The commit record in a real three-member etcd cluster on loopback, started once for
// this binary (docs/recovery.md, "The commit record", "In etcd"): compare-and-set
// semantics, the announcement's lease, members killed under use, every member down,
// and records that must never be followed.
#include "coord/etcd_commit_records.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/hash.h"
#include "coord/etcd_client.h"
#include "tests/coord/etcd_cluster.h"
#include "tests/temp_dir.h"
#include "topology/cluster_config.h"

namespace deltacast::coord {
namespace {

using relay::CommitRecord;
using relay::RefitInProgress;
using test_util::EtcdCluster;
using ::testing::HasSubstr;

EtcdCluster* g_etcd = nullptr;
bool g_wanted = false;  // etcd is installed: a cluster that did not start is a failure

class EtcdEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!EtcdCluster::Available()) return;
    g_wanted = true;
    dir_ = std::make_unique<test_util::TempDir>("deltacast-etcd");
    cluster_ = std::make_unique<EtcdCluster>(dir_->path(), 3);
    ASSERT_TRUE(cluster_->Start());
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

const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new EtcdEnvironment);

#define REQUIRE_ETCD()                                                          \
  do {                                                                          \
    if (g_wanted && !g_etcd) FAIL() << "the etcd of this binary did not start"; \
    if (!g_etcd) GTEST_SKIP() << EtcdCluster::kSkipMessage;                     \
  } while (false)

Digest128 Version(uint8_t n) {
  Digest128 d;
  d.bytes.fill(n);
  return d;
}

std::unique_ptr<EtcdClient> Client(std::chrono::milliseconds timeout = std::chrono::seconds(2)) {
  EtcdOptions o;
  o.endpoints = g_etcd->endpoints();
  o.request_timeout = timeout;
  auto client = EtcdClient::Create(o);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return std::move(*client);
}

// Each test its own cluster name: they share one etcd.
std::unique_ptr<EtcdCommitRecords> Store(
    const std::string& cluster, std::chrono::milliseconds timeout = std::chrono::seconds(2)) {
  return std::make_unique<EtcdCommitRecords>(Client(timeout), "/deltacast-test", cluster);
}

CommitRecord Record(const std::string& cluster, uint64_t refit, bool commit,
                    const std::string& by = "source") {
  return CommitRecord{.cluster = cluster,
                      .refit_id = refit,
                      .base_version = Version(1),
                      .target_version = Version(2),
                      .commit = commit,
                      .decided_by = by};
}

RefitInProgress Refit(const std::string& cluster, uint64_t refit) {
  return RefitInProgress{.cluster = cluster,
                         .refit_id = refit,
                         .base_version = Version(1),
                         .target_version = Version(2),
                         .source_alive = true};
}

// Waits (polling) until `done` holds; false after `timeout`.
template <typename F>
bool WaitFor(F done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

TEST(EtcdClient, KeysValuesTransactionsAndLeases) {
  REQUIRE_ETCD();
  auto client = Client();
  // Keys and values are bytes: every byte value survives base64 both ways.
  std::string binary;
  for (int i = 0; i < 256; ++i) binary += static_cast<char>(i);
  const std::string prefix = "/client-test/";
  ASSERT_TRUE(client->Put(prefix + "a", binary).ok());
  ASSERT_TRUE(client->Put(prefix + "b", "").ok());
  ASSERT_TRUE(client->Put(prefix + binary.substr(1), "x").ok());
  auto a = client->Range(prefix + "a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->size(), 1u);
  EXPECT_EQ((*a)[0].value, binary);
  EXPECT_GT((*a)[0].create_revision, 0);
  auto missing = client->Range(prefix + "nothing");
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(missing->empty());

  RangeOptions all{
      .range_end = PrefixEnd(prefix), .limit = 0, .newest_first = false, .keys_only = false};
  auto listed = client->Range(prefix, all);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[0].key, prefix + binary.substr(1));  // by key: \x01 sorts first
  EXPECT_EQ((*listed)[2].key, prefix + "b");
  all.newest_first = true;
  all.limit = 2;
  listed = client->Range(prefix, all);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].key, prefix + binary.substr(1));  // written last
  EXPECT_EQ((*listed)[1].key, prefix + "b");

  // Create-if-absent: the first writes, the second gets what stands.
  auto created = client->CreateIfAbsent(prefix + "cas", "first");
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_FALSE(created->has_value());
  auto second = client->CreateIfAbsent(prefix + "cas", "second");
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(second->has_value());
  EXPECT_EQ((*second)->value, "first");

  // A transaction guarded by existence runs only when the guard holds.
  std::vector<TxnOp> del(1);
  del[0].kind = TxnOp::Kind::kDelete;
  del[0].key = prefix + "a";
  auto guarded = client->Txn({prefix + "nothing"}, {}, del);
  ASSERT_TRUE(guarded.ok());
  EXPECT_FALSE(guarded->succeeded);
  EXPECT_EQ(client->Range(prefix + "a")->size(), 1u);
  guarded = client->Txn({prefix + "cas"}, {prefix + "nothing"}, del);
  ASSERT_TRUE(guarded.ok());
  EXPECT_TRUE(guarded->succeeded);
  EXPECT_TRUE(client->Range(prefix + "a")->empty());

  // A leased key goes with its lease.
  auto lease = client->LeaseGrant(5);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(client->Put(prefix + "leased", "v", *lease).ok());
  auto ttl = client->LeaseKeepAlive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_GE(*ttl, 4);
  ASSERT_TRUE(client->LeaseRevoke(*lease).ok());
  EXPECT_TRUE(client->Range(prefix + "leased")->empty());
  EXPECT_EQ(client->LeaseKeepAlive(*lease).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(client->LeaseRevoke(*lease).ok());  // already gone: fine
  EXPECT_EQ(client->Put(prefix + "x", "v", *lease).code(), StatusCode::kNotFound);

  auto deleted = client->DeleteRange(prefix, PrefixEnd(prefix));
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 3);  // b, the binary key, cas
}

TEST(EtcdCommitRecords, FirstDecisionWinsAndCommitIsNeverReplaced) {
  REQUIRE_ETCD();
  auto store = Store("cas");
  auto none = store->Read(7);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());

  auto first = store->Decide(Record("cas", 7, true));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->commit);
  EXPECT_EQ(first->decided_by, "source");
  // A coordinator's ABORT after the COMMIT: the COMMIT stands and is returned.
  auto late = store->Decide(Record("cas", 7, false, "coordinator:w3"));
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_TRUE(late->commit);
  EXPECT_EQ(late->decided_by, "source");
  auto read = Store("cas")->Read(7);  // another reader, another connection
  ASSERT_TRUE(read.ok());
  ASSERT_TRUE(read->has_value());
  EXPECT_TRUE((*read)->commit);
  EXPECT_EQ((*read)->base_version, Version(1));
  EXPECT_EQ((*read)->target_version, Version(2));

  // An ABORT written first holds against the source's COMMIT.
  ASSERT_TRUE(store->Decide(Record("cas", 8, false, "coordinator:w3")).ok());
  auto commit = store->Decide(Record("cas", 8, true));
  ASSERT_TRUE(commit.ok());
  EXPECT_FALSE(commit->commit);
  EXPECT_EQ(commit->decided_by, "coordinator:w3");

  // What is stored: the documented JSON under the documented key.
  auto raw = store->client().Range("/deltacast-test/cas/records/0000000000000007");
  ASSERT_TRUE(raw.ok());
  ASSERT_EQ(raw->size(), 1u);
  const auto j = nlohmann::json::parse((*raw)[0].value);
  EXPECT_EQ(j["format"], 1);
  EXPECT_EQ(j["cluster"], "cas");
  EXPECT_EQ(j["refit_id"], "0000000000000007");
  EXPECT_EQ(j["outcome"], "commit");
  EXPECT_EQ(j["base_version"], Version(1).ToHex());
  EXPECT_EQ(j["target_version"], Version(2).ToHex());
  EXPECT_EQ(j["decided_by"], "source");

  // A record of another cluster is refused before anything is sent.
  EXPECT_EQ(store->Decide(Record("other", 9, true)).status().code(), StatusCode::kInvalidArgument);
}

TEST(EtcdCommitRecords, RacingDecisionsAllSeeTheSameRecord) {
  REQUIRE_ETCD();
  constexpr int kThreads = 8;
  for (uint64_t refit = 1; refit <= 5; ++refit) {
    std::vector<std::thread> threads;
    std::vector<Result<CommitRecord>> results(kThreads, Status::Internal("not run"));
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        results[static_cast<size_t>(t)] = Store("race")->Decide(Record(
            "race", refit, t % 2 == 0, t % 2 == 0 ? "source" : "coordinator:" + std::to_string(t)));
      });
    }
    for (auto& t : threads) t.join();
    auto standing = Store("race")->Read(refit);
    ASSERT_TRUE(standing.ok() && standing->has_value());
    for (const auto& r : results) {
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->commit, (*standing)->commit) << "refit " << refit;
      EXPECT_EQ(r->decided_by, (*standing)->decided_by) << "refit " << refit;
    }
  }
}

TEST(EtcdCommitRecords, RecentIsTheNewestRecordsOldestFirst) {
  REQUIRE_ETCD();
  auto store = Store("recent");
  auto empty = store->Recent(3);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  // Written in an order unlike the ids: Recent follows the writes.
  for (uint64_t refit : {50, 10, 40, 20, 30}) {
    ASSERT_TRUE(store->Decide(Record("recent", refit, refit != 40)).ok());
  }
  auto recent = store->Recent(3);
  ASSERT_TRUE(recent.ok()) << recent.status().ToString();
  ASSERT_EQ(recent->size(), 3u);
  EXPECT_EQ((*recent)[0].refit_id, 40u);
  EXPECT_FALSE((*recent)[0].commit);
  EXPECT_EQ((*recent)[1].refit_id, 20u);
  EXPECT_EQ((*recent)[2].refit_id, 30u);
  EXPECT_EQ(store->Recent(100)->size(), 5u);
  EXPECT_TRUE(Store("recent-other")->Recent(10)->empty());  // clusters do not mix
}

// Pruning (CommitRecordStore::Prune): more records than one transaction deletes,
// written in an order unlike their ids; the newest K stay, Recent still answers, and
// announcements are deleted only for refits that have a record.
TEST(EtcdCommitRecords, PruneKeepsTheNewestRecordsAndUndecidedAnnouncements) {
  REQUIRE_ETCD();
  auto store = Store("prune");
  auto other = Store("prune-other");
  for (uint64_t refit = 1; refit <= 5; ++refit) {
    ASSERT_TRUE(other->Decide(Record("prune-other", refit, true)).ok());
  }
  // Refit 3's announcement never withdrawn (its source died after the record).
  ASSERT_TRUE(store->Announce(Refit("prune", 3 * 7919 % 1000), 30.0).ok());
  constexpr uint64_t kWritten = 150, kKept = 20;
  std::vector<uint64_t> order;
  for (uint64_t i = 1; i <= kWritten; ++i) order.push_back(i * 7919 % 1000);  // distinct ids
  for (uint64_t refit : order) {
    ASSERT_TRUE(store->Decide(Record("prune", refit, refit % 3 != 0)).ok());
  }
  // Undecided refits: their announcements must survive. A decided one's left behind
  // (a Withdraw that failed) must go.
  ASSERT_TRUE(store->Announce(Refit("prune", 5001), 30.0).ok());
  ASSERT_TRUE(store->Announce(Refit("prune", 5002), 30.0).ok());
  ASSERT_TRUE(store->Announce(Refit("prune", 5003), 30.0).ok());
  ASSERT_TRUE(store->Decide(Record("prune", 5003, true)).ok());

  auto pruned = store->Prune(kKept);
  ASSERT_TRUE(pruned.ok()) << pruned.status().ToString();
  EXPECT_EQ(pruned->records, kWritten + 1 - kKept);
  EXPECT_EQ(pruned->announcements, 2u);  // refit 3 * 7919 % 1000's and 5003's

  auto recent = store->Recent(1000);
  ASSERT_TRUE(recent.ok()) << recent.status().ToString();
  ASSERT_EQ(recent->size(), kKept);
  // The newest K, oldest first: order's last K - 1, then 5003.
  for (size_t i = 0; i + 1 < kKept; ++i) {
    EXPECT_EQ((*recent)[i].refit_id, order[kWritten - (kKept - 1) + i]) << "at " << i;
  }
  EXPECT_EQ(recent->back().refit_id, 5003u);
  EXPECT_FALSE(store->Read(order.front())->has_value()) << "the oldest record survived";
  EXPECT_TRUE(store->Read(order.back())->has_value()) << "the newest record was pruned";
  EXPECT_TRUE(store->client().Range(store->AnnouncedKey(3 * 7919 % 1000))->empty());
  EXPECT_TRUE(store->client().Range(store->AliveKey(3 * 7919 % 1000))->empty());
  auto undecided = store->Undecided();
  ASSERT_TRUE(undecided.ok()) << undecided.status().ToString();
  ASSERT_EQ(undecided->size(), 2u) << "an undecided refit's announcement was pruned";
  EXPECT_EQ((*undecided)[0].refit_id, 5001u);
  EXPECT_EQ((*undecided)[1].refit_id, 5002u);
  EXPECT_EQ(other->Recent(100)->size(), 5u) << "another cluster's records were pruned";

  // Again: nothing left to prune. A record written after still stands.
  pruned = store->Prune(kKept);
  ASSERT_TRUE(pruned.ok());
  EXPECT_EQ(pruned->records + pruned->announcements, 0u);
  ASSERT_TRUE(store->Decide(Record("prune", 5001, false, "coordinator:x")).ok());
  EXPECT_EQ(store->Recent(1)->back().refit_id, 5001u);
}

TEST(EtcdCommitRecords, AnnouncementLapsesWhenNotRenewedAndStaysUndecided) {
  REQUIRE_ETCD();
  auto store = Store("lease");
  ASSERT_TRUE(store->Announce(Refit("lease", 1), 1.0).ok());
  ASSERT_TRUE(store->Announce(Refit("lease", 2), 30.0).ok());
  auto undecided = store->Undecided();
  ASSERT_TRUE(undecided.ok()) << undecided.status().ToString();
  ASSERT_EQ(undecided->size(), 2u);
  EXPECT_TRUE((*undecided)[0].source_alive);
  EXPECT_EQ((*undecided)[0].base_version, Version(1));
  EXPECT_EQ((*undecided)[0].target_version, Version(2));

  // Renewed every 300 ms, a 1 s announcement lives on past its ttl.
  const auto renew_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2500);
  auto stopped = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < renew_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(store->Renew(1).ok());
    stopped = std::chrono::steady_clock::now();
  }
  undecided = store->Undecided();
  ASSERT_TRUE(undecided.ok());
  ASSERT_EQ(undecided->size(), 2u);
  EXPECT_TRUE((*undecided)[0].source_alive);

  // Not renewed: the source counts as lost, and the refit is still found.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto u = store->Undecided();
        return u.ok() && u->size() == 2 && !(*u)[0].source_alive && (*u)[1].source_alive;
      },
      std::chrono::seconds(6)));
  EXPECT_GE(std::chrono::steady_clock::now() - stopped, std::chrono::milliseconds(900));

  // No record yet: the announcement may not be withdrawn.
  EXPECT_EQ(store->Withdraw(1).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(store->Undecided()->size(), 2u);
  // A late Renew announces the source alive again.
  ASSERT_TRUE(store->Renew(1).ok());
  EXPECT_TRUE((*store->Undecided())[0].source_alive);
  EXPECT_EQ(store->Renew(99).code(), StatusCode::kNotFound);

  // The coordinator aborts refit 1: it is decided, no longer listed.
  ASSERT_TRUE(Store("lease")->Decide(Record("lease", 1, false, "coordinator:x")).ok());
  undecided = store->Undecided();
  ASSERT_TRUE(undecided.ok());
  ASSERT_EQ(undecided->size(), 1u);
  EXPECT_EQ((*undecided)[0].refit_id, 2u);
  ASSERT_TRUE(store->Withdraw(1).ok());
  EXPECT_TRUE(store->client().Range(store->AnnouncedKey(1))->empty());
  EXPECT_TRUE(store->client().Range(store->AliveKey(1))->empty());
  EXPECT_FALSE(store->client().Range(store->RecordKey(1))->empty());

  ASSERT_TRUE(store->Decide(Record("lease", 2, true)).ok());
  ASSERT_TRUE(store->Withdraw(2).ok());
  EXPECT_TRUE(store->Undecided()->empty());
  EXPECT_TRUE(Store("lease-other")->Undecided()->empty());
  // Announcing another cluster's refit is refused.
  EXPECT_EQ(store->Announce(Refit("other", 3), 5).code(), StatusCode::kInvalidArgument);
}

TEST(EtcdCommitRecords, BadRecordsAreLoggedAndNeverFollowed) {
  REQUIRE_ETCD();
  auto store = Store("bad");
  EtcdClient& raw = store->client();
  auto good = nlohmann::json::parse(
      R"({"format":1,"cluster":"bad","refit_id":"0000000000000001","outcome":"commit",
          "decided_by":"source"})");
  good["base_version"] = Version(1).ToHex();
  good["target_version"] = Version(2).ToHex();
  struct Case {
    uint64_t refit;
    std::string value;
    std::string logged;
  };
  auto with = [&](uint64_t refit, const char* field, nlohmann::json value) {
    nlohmann::json j = good;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(refit));
    j["refit_id"] = hex;
    if (value.is_null()) {
      j.erase(field);
    } else {
      j[field] = value;
    }
    return j.dump();
  };
  const std::vector<Case> cases = {
      {1, "not json {", "not a JSON object"},
      {2, with(2, "cluster", "another"), "names cluster \"another\""},
      {3, with(3, "refit_id", "0000000000000004"), "names refit 0000000000000004"},
      {4, with(4, "outcome", "maybe"), "outcome is not"},
      {5, with(5, "format", 2), "format is not 1"},
      {6, with(6, "target_version", "zz"), "target_version is not 32 hex digits"},
      {7, with(7, "decided_by", nullptr), "no decided_by"},
  };
  for (const Case& c : cases) ASSERT_TRUE(raw.Put(store->RecordKey(c.refit), c.value).ok());
  for (const Case& c : cases) {
    ::testing::internal::CaptureStderr();
    auto read = store->Read(c.refit);
    const std::string logged = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_FALSE(read->has_value()) << "refit " << c.refit << " was followed";
    EXPECT_THAT(logged, HasSubstr(c.logged)) << "refit " << c.refit;
    EXPECT_THAT(logged, HasSubstr("never followed"));
    // It stands, so no decision can be written over it, and Decide says so.
    auto decided = store->Decide(Record("bad", c.refit, true));
    EXPECT_EQ(decided.status().code(), StatusCode::kCorrupt) << "refit " << c.refit;
  }
  // A record of other versions than the decider holds is not followed either.
  ASSERT_TRUE(store->Decide(Record("bad", 20, true)).ok());
  CommitRecord other_versions = Record("bad", 20, true);
  other_versions.target_version = Version(3);
  auto mismatch = store->Decide(other_versions);
  EXPECT_EQ(mismatch.status().code(), StatusCode::kCorrupt);
  EXPECT_THAT(mismatch.status().message(), HasSubstr("not followed"));
  // Recent leaves every bad one out; a key that is no refit id too.
  ASSERT_TRUE(raw.Put("/deltacast-test/bad/records/xyz", good.dump()).ok());
  auto recent = store->Recent(100);
  ASSERT_TRUE(recent.ok());
  ASSERT_EQ(recent->size(), 1u);
  EXPECT_EQ((*recent)[0].refit_id, 20u);
  // A bad announcement is left out of Undecided.
  ASSERT_TRUE(raw.Put(store->AnnouncedKey(30), with(30, "cluster", "another")).ok());
  ASSERT_TRUE(store->Announce(Refit("bad", 31), 30).ok());
  auto undecided = store->Undecided();
  ASSERT_TRUE(undecided.ok());
  ASSERT_EQ(undecided->size(), 1u);
  EXPECT_EQ((*undecided)[0].refit_id, 31u);
}

// The remaining tests kill members; each leaves every member running.

TEST(EtcdCommitRecords, AMemberKilledUnderUseIsRoutedAround) {
  REQUIRE_ETCD();
  auto store = Store("member-down");
  std::atomic<bool> stop{false};
  std::atomic<int> done{0};
  std::vector<std::string> errors;
  std::thread user([&] {
    for (uint64_t refit = 1; !stop; ++refit) {
      auto decided = store->Decide(Record("member-down", refit, refit % 3 != 0));
      auto read = store->Read(refit);
      if (!decided.ok()) errors.push_back(decided.status().ToString());
      if (!read.ok() || !read->has_value()) {
        errors.push_back("read " + std::to_string(refit) + ": " + read.status().ToString());
      }
      ++done;
    }
  });
  ASSERT_TRUE(WaitFor([&] { return done >= 5; }, std::chrono::seconds(5)));
  // The first endpoint, where every request goes first.
  g_etcd->Kill(0);
  const int at_kill = done;
  EXPECT_TRUE(WaitFor([&] { return done >= at_kill + 20; }, std::chrono::seconds(10)));
  stop = true;
  user.join();
  EXPECT_TRUE(errors.empty()) << errors.size() << " errors, first: " << errors.front();
  ASSERT_TRUE(g_etcd->Restart(0));
  // Every request to the killed member's successor reads the same records.
  auto recent = Store("member-down")->Recent(1000);
  ASSERT_TRUE(recent.ok());
  EXPECT_EQ(static_cast<int>(recent->size()), done.load());
}

TEST(EtcdCommitRecords, EveryMemberDownIsUnavailableAndWritesNothing) {
  REQUIRE_ETCD();
  auto store = Store("all-down");
  ASSERT_TRUE(store->Announce(Refit("all-down", 2), 30).ok());
  g_etcd->KillAll();
  const auto start = std::chrono::steady_clock::now();
  auto decided = store->Decide(Record("all-down", 1, true));
  EXPECT_EQ(decided.status().code(), StatusCode::kUnavailable) << decided.status().ToString();
  EXPECT_THAT(decided.status().message(), HasSubstr("nothing sent"));
  EXPECT_EQ(store->Read(1).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(store->Announce(Refit("all-down", 3), 5).code(), StatusCode::kUnavailable);
  EXPECT_EQ(store->Renew(2).code(), StatusCode::kUnavailable);
  EXPECT_EQ(store->Undecided().status().code(), StatusCode::kUnavailable);
  // Refused connections cost no timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  ASSERT_TRUE(g_etcd->RestartAll());
  auto read = Store("all-down")->Read(1);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_FALSE(read->has_value());
  auto undecided = store->Undecided();
  ASSERT_TRUE(undecided.ok());
  ASSERT_EQ(undecided->size(), 1u);
  EXPECT_EQ((*undecided)[0].refit_id, 2u);
}

TEST(EtcdCommitRecords, NoQuorumIsATimeoutWithTheOutcomeUnknown) {
  REQUIRE_ETCD();
  auto store = Store("no-quorum", std::chrono::milliseconds(700));
  g_etcd->Kill(1);
  g_etcd->Kill(2);
  // Member 0 takes the request but cannot commit it alone.
  auto decided = store->Decide(Record("no-quorum", 1, true));
  EXPECT_EQ(decided.status().code(), StatusCode::kTimeout) << decided.status().ToString();
  EXPECT_THAT(decided.status().message(), HasSubstr("may or may not"));
  ASSERT_TRUE(g_etcd->RestartAll());
  // Whatever happened, one record stands and every reader sees the same.
  auto again = Store("no-quorum")->Decide(Record("no-quorum", 1, false, "coordinator:y"));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto read = Store("no-quorum")->Read(1);
  ASSERT_TRUE(read.ok() && read->has_value());
  EXPECT_EQ((*read)->commit, again->commit);
}

TEST(EtcdCommitRecords, MadeFromTheConfig) {
  REQUIRE_ETCD();
  const std::string nodes =
      "[[node]]\nid = \"s\"\nhost = \"127.0.0.1\"\nport = 7000\nrole = \"source\"\n"
      "[[node]]\nid = \"r\"\nhost = \"127.0.0.1\"\nport = 7001\n";
  auto plain = topology::ParseClusterConfig("[cluster]\nname = \"cfg\"\n" + nodes, "/x/c.toml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(MakeCommitRecordStore(*plain).status().code(), StatusCode::kInvalidArgument);

  std::string endpoints;
  // A dead endpoint first: the store moves past it.
  for (const std::string& e : g_etcd->endpoints()) endpoints += ", \"" + e + "\"";
  const std::string text =
      "[cluster]\nname = \"cfg\"\n[coordination]\nendpoints = "
      "[\"http://127.0.0.1:1\"" +
      endpoints + "]\nprefix = \"/cfg-test\"\n" + nodes;
  auto config = topology::ParseClusterConfig(text, "/x/c.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ::unsetenv(topology::kEtcdUserEnv);
  ::unsetenv(topology::kEtcdPasswordEnv);
  auto store = MakeCommitRecordStore(*config);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto decided = (*store)->Decide(Record("cfg", 5, true));
  ASSERT_TRUE(decided.ok()) << decided.status().ToString();
  EXPECT_EQ(Client()->Range("/cfg-test/cfg/records/0000000000000005")->size(), 1u);

  ::setenv(topology::kEtcdUserEnv, "root", 1);
  auto half = MakeCommitRecordStore(*config);
  ::unsetenv(topology::kEtcdUserEnv);
  EXPECT_EQ(half.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(half.status().message(), HasSubstr(topology::kEtcdPasswordEnv));
}

}  // namespace
}  // namespace deltacast::coord
