// What the root trusts and what it checks (docs/producers.md, "What is trusted"):
// a trainer's mistakes that the linear partition hash alone cannot see (a producer
// that compares against another base, two ranks that claim the same coordinates) are
// refused at the root, naming the producer, before anything goes down the tree; the
// receivers stay at their version, and the next correct refit commits.
#include <gtest/gtest.h>

#include <fstream>

#include "apply/safetensors.h"
#include "tests/relay/producers/root_fixture.h"

namespace deltacast::relay {
namespace {

codec::Manifest ManifestOf(const apply::WeightStore& store) {
  return codec::ComputeManifest(
      store.tensors(), [&](size_t i) { return store.TensorData(i); }, kPartitionBytes, 1);
}

class RootTrustTest : public RootTest {
 protected:
  // A copy of rank `r`'s shard at `step` with one BF16 element one ulp off, at a
  // position the step after it does not change: a corrupt previous shard whose
  // damage the producer's own compare cannot see.
  std::unique_ptr<ShardFile> NudgedShard(size_t r, int step) {
    const ShardFile& at = *ranks_[r]->steps[step];
    const ShardFile& next = *ranks_[r]->steps[step + 1];
    const fs::path copy = dir_.path() / ("nudged-" + std::to_string(r) + ".safetensors");
    fs::copy_file(at.path(), copy, fs::copy_options::overwrite_existing);
    auto header = apply::ReadSafetensorsHeader(copy);
    EXPECT_TRUE(header.ok());
    for (size_t t = 0; t < at.tensors().size(); ++t) {
      if (at.tensors()[t].dtype != DType::kBF16) continue;
      const ByteSpan a = at.TensorData(t), b = next.TensorData(t);
      for (size_t i = 0; i + 1 < a.size(); i += 2) {
        if (a[i] != b[i] || a[i + 1] != b[i + 1]) continue;
        std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(static_cast<std::streamoff>(header->data_section_offset +
                                            header->entries[t].data_begin + i));
        const char nudged = static_cast<char>(a[i] ^ std::byte{1});
        f.write(&nudged, 1);
        nudged_tensor_ = at.tensors()[t].name;
        f.close();
        auto opened = ShardFile::Open(copy);
        EXPECT_TRUE(opened.ok()) << opened.status().ToString();
        return opened.ok() ? std::move(*opened) : nullptr;
      }
    }
    ADD_FAILURE() << "no unchanged BF16 element in rank " << r;
    return nullptr;
  }

  std::string nudged_tensor_;
};

TEST_F(RootTrustTest, AProducerWhoseBaseIsOneUlpOffIsRefusedAtTheRootAndNothingIsSent) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob("tp=2", 0, 3'000'000, 1));
  ASSERT_NO_FATAL_FAILURE(StartTree(2));
  for (size_t r = 0; r < ranks_.size(); ++r) producers_.push_back(ConnectProducer(r));
  auto nudged = NudgedShard(1, 0);
  ASSERT_NE(nudged, nullptr);
  const ShareInput wrong{&ranks_[1]->placement.map,
                         [&](uint32_t i) { return nudged->TensorData(i); },
                         [&](uint32_t i) { return ranks_[1]->steps[1]->TensorData(i); }};
  // `publish --base S/step0`: the root knows the base manifest.
  const codec::Manifest base = ManifestOf(*Canonical(0));
  std::vector<Served> served;
  auto report = Refit(0, &served, {{1, wrong}}, &base);
  ASSERT_FALSE(report.ok()) << "committed over a wrong base";
  const std::string why = report.status().ToString();
  EXPECT_NE(why.find("producer rank-00001 compared against another base"), std::string::npos)
      << why;
  EXPECT_NE(why.find("nothing was sent"), std::string::npos) << why;
  EXPECT_FALSE(served[0].committed);
  ExpectReceiversAt(0);
  // With its real base the same refit commits, bit-exact.
  auto again = Refit(0, nullptr, {}, &base);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->publish.committed) << again->publish.abort_reason;
  ExpectReceiversAt(1);
}

TEST_F(RootTrustTest, ProducersThatMovedOnWhileTheTreeStayedAreRefused) {
  // A refit aborted and the trainer moved on: rank 0 compares step 1 -> 2 while the
  // tree holds step 0 (`publish --base S/step0`); the others still compare 0 -> 1.
  ASSERT_NO_FATAL_FAILURE(SetUpJob("tp=2,pp=2", 0, 3'000'000, 2));
  ASSERT_NO_FATAL_FAILURE(StartTree(2));
  for (size_t r = 0; r < ranks_.size(); ++r) producers_.push_back(ConnectProducer(r));
  const codec::Manifest base = ManifestOf(*Canonical(0));
  auto report = Refit(0, nullptr, {{0, ranks_[0]->Input(1)}}, &base);
  ASSERT_FALSE(report.ok()) << "committed a checkpoint equal to no step";
  EXPECT_NE(report.status().message().find("rank-00000"), std::string::npos)
      << report.status().ToString();
  ExpectReceiversAt(0);
}

TEST_F(RootTrustTest, AStaleBaseAgainstTheRootsLastCommittedVersionIsRefused) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob("tp=2", 0, 3'000'000, 2));
  ASSERT_NO_FATAL_FAILURE(StartTree(2));
  for (size_t r = 0; r < ranks_.size(); ++r) producers_.push_back(ConnectProducer(r));
  auto first = Refit(0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(first->publish.committed) << first->publish.abort_reason;
  ExpectReceiversAt(1);
  // Rank 1 restarted with step 0's shard as its previous version: it compares
  // 0 -> 2 while the tree holds step 1. No base is given: the root keeps step 1.
  const ShareInput stale{&ranks_[1]->placement.map,
                         [&](uint32_t i) { return ranks_[1]->steps[0]->TensorData(i); },
                         [&](uint32_t i) { return ranks_[1]->steps[2]->TensorData(i); }};
  auto report = Refit(1, nullptr, {{1, stale}});
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("rank-00001"), std::string::npos)
      << report.status().ToString();
  ExpectReceiversAt(1);
  auto again = Refit(1);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->publish.committed) << again->publish.abort_reason;
  ExpectReceiversAt(2);
}

TEST_F(RootTrustTest, TwoRanksClaimingTheSameCoordinatesAreRefusedBeforeAnythingIsSent) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob("tp=2", 0, 3'000'000, 1));
  // Rank 1 runs with rank 0's layout file ([rank] tp = 0 twice): an overlap and a
  // gap of the same size, which the per-partition counts cannot see.
  const fs::path shards = agent::ShardDirOf(dir_.path() / "step0");
  auto twin = LoadRankPlacement(shards / "rank-00000.toml", ranks_[1]->steps[0]->tensors());
  ASSERT_TRUE(twin.ok()) << twin.status().ToString();
  ranks_[1]->placement = std::move(*twin);
  ASSERT_NO_FATAL_FAILURE(StartTree(2));
  for (size_t r = 0; r < ranks_.size(); ++r) producers_.push_back(ConnectProducer(r));
  auto report = Refit(0);
  ASSERT_FALSE(report.ok()) << "committed with two owners of one element";
  const std::string why = report.status().ToString();
  EXPECT_NE(why.find("covered twice"), std::string::npos) << why;
  EXPECT_NE(why.find("producer rank-00001"), std::string::npos) << why;
  EXPECT_NE(why.find("rank-00000.toml"), std::string::npos) << why;
  ExpectReceiversAt(0);
}

}  // namespace
}  // namespace deltacast::relay
