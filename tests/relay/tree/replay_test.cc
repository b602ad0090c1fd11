// ReplayFor: what a relay sends a child that (re)joins mid-refit, from its spool of
// a real delta's chunks.
#include "relay/tree/replay.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "apply/host_store.h"
#include "codec/chunk.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"

namespace deltacast::relay {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

constexpr uint64_t kPartitionBytes = 4 << 10;

class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("replay-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A delta of several data chunks (small chunks, every byte changed) and its END.
    const std::vector<TensorSpec> tensors{{"w", DType::kBF16, {1 << 14}}};
    std::mt19937 rng(3);
    Bytes base(tensors[0].ByteSize()), target;
    for (auto& b : base) b = std::byte(rng());
    target = base;
    for (auto& b : target) b = std::byte(rng());  // incompressible: a chunk a partition
    auto data = [](const Bytes& b) { return [&b](size_t) { return ByteSpan(b); }; };
    const codec::Manifest from = codec::ComputeManifest(tensors, data(base), kPartitionBytes, 1);
    const codec::Manifest to = codec::ComputeManifest(tensors, data(target), kPartitionBytes, 1);
    codec::DeltaEncoderOptions options;
    options.chunk_bytes = 4 << 10;
    options.on_calling_thread = true;
    ASSERT_TRUE(codec::EncodeDelta(from, to, data(base), data(target), Digest128{}, options,
                                   [&](std::vector<std::byte>&& chunk) {
                                     chunks_.push_back(EncodeChunk(chunk));
                                     return Status::Ok();
                                   })
                    .ok());
    ASSERT_GE(chunks_.size(), 4u);  // data chunks on both stripes, then the END
    begin_.refit_id = 7;
    begin_.base_version = from.VersionId();
    begin_.target_version = to.VersionId();
    begin_.partition_bytes = kPartitionBytes;
    begin_.stream_id = 9;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A spool holding the chunks `sequences` of the delta.
  std::shared_ptr<Spool> SpoolOf(const std::vector<uint32_t>& sequences) {
    auto spool = Spool::OpenEmpty(dir_, begin_.target_version);
    EXPECT_TRUE(spool.ok()) << spool.status().ToString();
    for (uint32_t s : sequences) EXPECT_TRUE((*spool)->Append(s, chunks_[s]).ok());
    return std::move(*spool);
  }
  // The chunks a child on `stripe` of `stripes` holding nothing is replayed: (sequence,
  // data?) in order.
  std::vector<std::pair<uint32_t, bool>> Replayed(const std::shared_ptr<Spool>& spool,
                                                  uint32_t stripe, uint32_t stripes) {
    Hello hello;
    hello.stripe = stripe;
    hello.stripes = stripes;
    std::vector<std::pair<uint32_t, bool>> out;
    for (const auto& m : ReplayFor(hello, begin_, spool, nullptr).messages) {
      if (m.chunk) out.emplace_back(m.chunk->sequence, m.chunk->data);
    }
    return out;
  }
  uint32_t End() const { return static_cast<uint32_t>(chunks_.size() - 1); }

  fs::path dir_;
  std::vector<Bytes> chunks_;
  Begin begin_;
};

// Striped, a relay may hold the END (come on another stripe) before a stripe's data
// chunks: that stripe's child is replayed what it has of the stripe and not the END,
// which must follow them on the link (the child takes every stripe's END for the
// whole delta: replayed first, the child failed the refit, "received 0 of 1 data
// chunks", and stayed behind: the simulator's --stripes --coord seed 144).
TEST_F(ReplayTest, AStripesEndIsNotReplayedBeforeItsDataChunks) {
  // Stripe 1's data chunks and the END; none of stripe 0's.
  std::vector<uint32_t> held;
  for (uint32_t s = 1; s < End(); s += 2) held.push_back(s);
  held.push_back(End());
  auto spool = SpoolOf(held);
  EXPECT_TRUE(Replayed(spool, 0, 2).empty());
  std::vector<std::pair<uint32_t, bool>> stripe1;
  for (uint32_t s = 1; s < End(); s += 2) stripe1.emplace_back(s, true);
  stripe1.emplace_back(End(), false);
  EXPECT_EQ(Replayed(spool, 1, 2), stripe1);
  // One of stripe 0's data chunks still missing: still no END there.
  held.insert(held.begin(), 0);
  spool = SpoolOf(held);
  const std::vector<std::pair<uint32_t, bool>> only0{{0, true}};
  EXPECT_EQ(Replayed(spool, 0, 2), only0);
}

TEST_F(ReplayTest, AWholeStripeIsReplayedWithItsEnd) {
  std::vector<uint32_t> all;
  for (uint32_t s = 0; s <= End(); ++s) all.push_back(s);
  auto spool = SpoolOf(all);
  std::vector<std::pair<uint32_t, bool>> stripe0;
  for (uint32_t s = 0; s < End(); s += 2) stripe0.emplace_back(s, true);
  stripe0.emplace_back(End(), false);
  EXPECT_EQ(Replayed(spool, 0, 2), stripe0);
  // One stripe: every chunk, in order.
  std::vector<std::pair<uint32_t, bool>> every;
  for (uint32_t s = 0; s <= End(); ++s) every.emplace_back(s, s != End());
  EXPECT_EQ(Replayed(spool, 0, 1), every);
}

}  // namespace
}  // namespace deltacast::relay
