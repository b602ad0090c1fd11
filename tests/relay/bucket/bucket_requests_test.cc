// The request channel through the bucket (relay/bucket/bucket_requests.h): a region node's
// FETCH and FETCH_MANIFEST reach the source as objects and its answers come back the
// same way. Real s3rver, the whole cluster in one process (bucket_fixture.h); every
// test checks every node's bytes by hash.
#include <gtest/gtest.h>

#include <future>
#include <optional>
#include <thread>

#include "objstore/bucket_layout.h"
#include "tests/relay/bucket/bucket_fixture.h"

namespace deltacast::relay {
namespace {

using namespace bucket_test;  // NOLINT: the fixture and its helpers

class BucketRequestsTest : public BucketBridgeTest {
 protected:
  objstore::BucketLayout Layout() const {
    return objstore::BucketLayout(config_.objstore->prefix, "bucket-eu");
  }
  // The objects under `folder`, once the bridge's best-effort deletes are done.
  size_t ObjectsLeftUnder(const std::string& folder) {
    size_t left = 0;
    for (int i = 0; i < 200; ++i) {
      auto list = s3_->List(folder);
      left = list.ok() ? list->size() : 1000;
      if (left == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return left;
  }
  template <class Pred>
  static bool WaitUntil(Pred pred, std::chrono::seconds limit = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return pred();
  }
  // As PrepareNodeBehindTheChain, then the uplink goes and eu2 joins, behind.
  std::future<Result<PublishReport>> PrepareBehindWithoutUplink(Versions& v) {
    request_timeout_ = std::chrono::milliseconds(20000);  // the test answers first
    auto publish = PrepareNodeBehindTheChain(v);
    if (HasFatalFailure()) return publish;
    uplink_->Stop();  // nobody answers requests but the test
    StartAgent(2, v, 0);
    return publish;
  }
  // Plays the uplink for eu2's FETCH_MANIFEST: writes `answer(request)` as its
  // answer object and deletes the request.
  template <class Answer>
  void AnswerTheRequest(Answer answer) {
    std::string key;
    ASSERT_TRUE(WaitUntil([&] {
      auto list = s3_->List(Layout().RequestsFolder());
      if (list.ok() && !list->empty()) key = list->front().key;
      return !key.empty();
    }));
    auto id = objstore::BucketLayout::RequestIdOf(key);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    auto request = s3_->Get(key);
    ASSERT_TRUE(request.ok()) << request.status().ToString();
    auto asked = ParseFetchManifest(*request);
    ASSERT_TRUE(asked.ok()) << asked.status().ToString();
    ASSERT_EQ(asked->request_id, *id);  // renumbered to its key's id
    ASSERT_TRUE(s3_->Put(Layout().Answer(*id), answer(*asked)).ok());
    ASSERT_TRUE(s3_->Delete(key).ok());
  }
  // Node i caught nothing up, committed nothing, and its bytes are version 0's.
  void ExpectUntouched(Versions& v, int i) {
    const NodeAgentStats stats = agents_[i]->stats();
    EXPECT_EQ(stats.partitions_caught_up, 0u);
    EXPECT_EQ(stats.refits_committed, 0u);
    EXPECT_EQ(stats.version, ManifestOf(*Borrow(v.tensors, v.v[0])).VersionId());
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.v[0][t]))
          << kNodes[i] << " tensor " << t << " was written";
    }
  }
  // Refits 0 -> 1 -> 2 with eu2 away (policy available: the bridge excuses it), the
  // bucket's chain keeping only the last: eu2, back at version 0, is behind further
  // than the chain reaches. Returns the third refit's Publish, begun at the bridge.
  std::future<Result<PublishReport>> PrepareNodeBehindTheChain(Versions& v) {
    keep_refits_ = 1;
    UseConfig("available", "bucket-eu");  // eu1 and eu2 both below the bridge
    StartBridge();
    for (int i = 0; i < 2; ++i) StartAgent(i, v, 0);
    StartSource();
    for (int k = 0; k < 2; ++k) {
      auto report = PublishStep(v, k);
      EXPECT_TRUE(report.ok() && report->committed);
    }
    auto publish = std::async(std::launch::async, [this, &v] { return PublishStep(v, 2); });
    // The downlink has begun refit 3: eu2 joins it (in time to take part), and its
    // parent replays it that BEGIN, whose base (2) it must first reach.
    EXPECT_TRUE(WaitUntil([&] { return downlink_->stats().refits == 3; }));
    return publish;
  }
};

// eu1's store has a torn partition (bytes that are neither the base's nor the
// target's, changed behind the engine's back): at END it asks its parent, the
// downlink, for the partition's target bytes; they come from the source through the
// bucket, eu1 checks them by hash, repairs, and the refit commits everywhere.
TEST_F(BucketRequestsTest, TornPartitionBelowTheBridgeIsRepairedThroughTheBucket) {
  Versions v = MakeVersions(1 << 18, 2, 11);
  ASSERT_NO_FATAL_FAILURE(UseConfig());
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  ASSERT_NO_FATAL_FAILURE(StartSource());
  // Partition 3 of tensor 1 (kPartitionBytes each), torn.
  auto& torn = stores_[1][1];
  for (uint64_t b = 3 * kPartitionBytes + 100; b < 3 * kPartitionBytes + 140; ++b) {
    torn[b] ^= std::byte{0x5a};
  }
  auto report = PublishStep(v, 0);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], report->target_version));
  ExpectAllAt(v, 1);
  EXPECT_GE(agents_[1]->stats().partitions_repaired, 1u);
  const BucketBridgeStats down = downlink_->stats(), up = uplink_->stats();
  EXPECT_GE(down.requests_up, 1u);
  EXPECT_EQ(down.answers, down.requests_up);
  EXPECT_EQ(down.requests_timed_out, 0u);
  EXPECT_EQ(up.requests_up, down.requests_up);
  EXPECT_EQ(up.answers, down.requests_up);
  // Every request and answer object is gone once answered.
  EXPECT_EQ(ObjectsLeftUnder(Layout().RequestsFolder()), 0u);
  EXPECT_EQ(ObjectsLeftUnder(Layout().AnswersFolder()), 0u);
}

// eu2 is behind further than the bucket's chain reaches: it fetches the target's
// manifest and every partition that differs from the source through the bucket,
// checks each by hash, then applies the refit and commits with the others.
TEST_F(BucketRequestsTest, NodeBehindTheChainCatchesUpByPartitionsThroughTheBucket) {
  Versions v = MakeVersions(1 << 17, 4, 12);
  auto publish = PrepareNodeBehindTheChain(v);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_NO_FATAL_FAILURE(StartAgent(2, v, 0));
  auto third = publish.get();
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  ASSERT_TRUE(third->committed) << third->abort_reason;
  EXPECT_EQ(third->nodes.size(), 3u);  // eu2 took part
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], third->target_version));
  ExpectAllAt(v, 3);
  const NodeAgentStats eu2 = agents_[2]->stats();
  EXPECT_GE(eu2.partitions_caught_up, 1u);
  EXPECT_EQ(eu2.deltas_caught_up, 0u);  // not by the chain: it does not reach back
  const BucketBridgeStats down = downlink_->stats();
  EXPECT_GE(down.requests_up, eu2.partitions_caught_up + 1);  // the manifest, the partitions
  EXPECT_EQ(down.requests_timed_out, 0u);
  EXPECT_EQ(ObjectsLeftUnder(Layout().RequestsFolder()), 0u);
}

// The same node behind, but the uplink is gone: its FETCH_MANIFEST is answered "not
// found" after the request timeout, the catch-up fails clearly, and its store is
// untouched.
TEST_F(BucketRequestsTest, RequestWithoutAnAnswerIsNotFoundAfterTheTimeout) {
  Versions v = MakeVersions(1 << 17, 4, 13);
  request_timeout_ = std::chrono::milliseconds(1500);
  auto publish = PrepareNodeBehindTheChain(v);
  ASSERT_FALSE(HasFatalFailure());
  uplink_->Stop();  // nobody answers requests any more
  const auto asked = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(StartAgent(2, v, 0));
  ASSERT_TRUE(WaitUntil([&] { return downlink_->stats().requests_timed_out >= 1; }));
  // Not before the timeout: the request was outstanding, unanswered, until then.
  EXPECT_GE(std::chrono::steady_clock::now() - asked, request_timeout_);
  const BucketBridgeStats down = downlink_->stats();
  EXPECT_EQ(down.answers, 0u);
  EXPECT_GE(down.requests_up, 1u);
  // The timed-out request is removed from the bucket.
  EXPECT_EQ(ObjectsLeftUnder(Layout().RequestsFolder()), 0u);
  auto report = publish.get();  // the source goes on without the away bridge
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ExpectUntouched(v, 2);
}

// The bucket is not trusted with answers: with the uplink gone, the test plays it
// and answers eu2's FETCH_MANIFEST with a forged MANIFEST (right type and id, the
// manifest of another version). The downlink passes it down; eu2 checks it against
// the version it asked for, refuses it, and writes nothing.
TEST_F(BucketRequestsTest, ForgedAnswerInTheBucketIsRefusedByTheNode) {
  Versions v = MakeVersions(1 << 17, 4, 14);
  auto publish = PrepareBehindWithoutUplink(v);
  ASSERT_FALSE(HasFatalFailure());
  const codec::Manifest other = ManifestOf(*Borrow(v.tensors, v.v[1]));
  std::optional<FetchManifest> asked;
  ASSERT_NO_FATAL_FAILURE(AnswerTheRequest([&](const FetchManifest& f) {
    asked = f;
    return EncodeManifest(f.request_id, true, other.Serialize());
  }));
  ASSERT_NE(other.VersionId(), asked->version);
  ASSERT_TRUE(WaitUntil([&] { return downlink_->stats().answers >= 1; }));
  auto report = publish.get();  // the source goes on without the away bridge
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ExpectUntouched(v, 2);
  EXPECT_EQ(ObjectsLeftUnder(Layout().AnswersFolder()), 0u);  // read and deleted
}

// An answer that is not of the request's type (a PARTITION for a FETCH_MANIFEST) is
// refused by the downlink itself, which answers "not found" at once, not after the
// timeout: nobody writes that answer again.
TEST_F(BucketRequestsTest, AnswerOfTheWrongTypeIsNotFoundAtOnce) {
  Versions v = MakeVersions(1 << 17, 4, 15);
  auto publish = PrepareBehindWithoutUplink(v);
  ASSERT_FALSE(HasFatalFailure());
  const uint64_t bad_before = downlink_->stats().bad_objects;
  ASSERT_NO_FATAL_FAILURE(AnswerTheRequest([](const FetchManifest& f) {
    const std::vector<std::byte> bytes(64, std::byte{7});
    return EncodePartition(f.request_id, true, bytes);
  }));
  // Read and deleted by the downlink, and neither passed down nor timed out: for a
  // request it still waits on, that is the refusal.
  EXPECT_EQ(ObjectsLeftUnder(Layout().AnswersFolder()), 0u);
  const BucketBridgeStats down = downlink_->stats();
  EXPECT_GT(down.bad_objects, bad_before);
  EXPECT_EQ(down.answers, 0u);
  EXPECT_EQ(down.requests_timed_out, 0u);  // well before the 20 s timeout
  auto report = publish.get();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ExpectUntouched(v, 2);
}

}  // namespace
}  // namespace deltacast::relay
