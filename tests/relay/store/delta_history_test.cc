// DeltaHistory: the source's kept deltas (add, prune to K, chains, reading chunks
// back, surviving a restart) and the catch-up messages of the relay protocol.
#include "relay/store/delta_history.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "codec/chunk.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kPartitionBytes = 4096;

// One BF16 tensor per version; version k+1 flips a few bytes of version k.
struct Lineage {
  TensorSpec tensor{"w", DType::kBF16, {1 << 17}};
  std::vector<std::vector<std::byte>> versions;
  codec::Manifest Manifest(size_t k) const {
    return codec::ComputeManifest(
        {tensor}, [&](size_t) { return ByteSpan(versions[k]); }, kPartitionBytes, 1);
  }
};

Lineage MakeLineage(size_t count) {
  Lineage l;
  std::mt19937 rng(5);
  l.versions.emplace_back(l.tensor.ByteSize());
  for (auto& b : l.versions[0]) b = std::byte(rng());
  for (size_t k = 1; k < count; ++k) {
    l.versions.push_back(l.versions.back());
    for (size_t i = 0; i < l.versions.back().size(); i += 13)
      l.versions.back()[i] ^= std::byte(1u << k);
  }
  return l;
}

class DeltaHistoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("delta-history-" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Spools the delta from version k to k + 1 as the publisher does; returns its link.
  ChainLink SpoolDelta(const Lineage& l, size_t k, std::unique_ptr<Spool>* out) {
    const codec::Manifest base = l.Manifest(k), target = l.Manifest(k + 1);
    auto spool = Spool::Open(dir_ / "spool", target.VersionId());
    EXPECT_TRUE(spool.ok());
    codec::DeltaEncoderOptions options;
    options.chunk_bytes = 4096;
    options.threads = 1;
    Status s = codec::EncodeDelta(
        base, target, [&](size_t) { return ByteSpan(l.versions[k]); },
        [&](size_t) { return ByteSpan(l.versions[k + 1]); }, Digest128{}, options,
        [&](std::vector<std::byte>&& chunk) {
          auto header = codec::PeekChunkHeader(chunk);
          return (*spool)->Append(header->sequence, EncodeChunk(chunk));
        });
    EXPECT_TRUE(s.ok()) << s.ToString();
    const uint32_t chunks = static_cast<uint32_t>((*spool)->sequences().size());
    *out = std::move(*spool);
    return {base.VersionId(), target.VersionId(), kPartitionBytes, chunks};
  }

  fs::path dir_;
};

TEST_F(DeltaHistoryTest, KeepsTheLastKAndChainsThemBackToAVersion) {
  const Lineage l = MakeLineage(5);
  std::vector<ChainLink> links;
  {
    DeltaHistory history(dir_ / "history", 3);
    for (size_t k = 0; k < 4; ++k) {
      std::unique_ptr<Spool> spool;
      links.push_back(SpoolDelta(l, k, &spool));
      ASSERT_GT(links.back().chunks, 2u);
      ASSERT_TRUE(history.Add(std::move(spool), links.back()).ok());
    }
    EXPECT_EQ(history.size(), 3u);  // v0 -> v1 was dropped
  }
  DeltaHistory history(dir_ / "history", 3);  // as after a restart
  ASSERT_EQ(history.size(), 3u);
  const auto v = [&](size_t k) { return l.Manifest(k).VersionId(); };
  auto chain = history.Chain(v(1), v(4));
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(chain[0].base, v(1));
  EXPECT_EQ(chain[2].target, v(4));
  EXPECT_EQ(chain[1].chunks, links[2].chunks);
  EXPECT_EQ(history.Chain(v(2), v(3)).size(), 1u);
  EXPECT_TRUE(history.Chain(v(0), v(4)).empty());  // too far back
  EXPECT_TRUE(history.Chain(v(4), v(4)).empty());
  EXPECT_TRUE(history.Chain(v(3), v(2)).empty());  // never backwards
  // Chunks read back are the delta's own, END last.
  const ChainLink& last = chain.back();
  auto end = history.Read(last.target, last.chunks - 1);
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  auto parsed = codec::ParseChunk(ChunkOf(**end));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->kind, codec::ChunkKind::kEnd);
  EXPECT_EQ(parsed->identity.target_version, v(4));
  EXPECT_FALSE(history.Read(v(1), 0).ok());  // v0 -> v1 is gone
  EXPECT_FALSE(history.Read(last.target, last.chunks).ok());
  // Only the kept spool files remain.
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir_ / "history")) {
    files += entry.path().extension() == ".spool";
  }
  EXPECT_EQ(files, 3u);
}

TEST_F(DeltaHistoryTest, KeepingNoneDeletesTheSpool) {
  const Lineage l = MakeLineage(2);
  std::unique_ptr<Spool> spool;
  const ChainLink link = SpoolDelta(l, 0, &spool);
  const fs::path file = spool->path();
  DeltaHistory history(dir_ / "history", 0);
  ASSERT_TRUE(history.Add(std::move(spool), link).ok());
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(history.size(), 0u);
}

// An index that cannot be written (a full disk; here a directory where its temporary
// file goes) leaves the chain as it was, in memory and on disk, so a retry writes it.
// Before, the link stayed in memory only: the retry saw it kept and wrote nothing, and
// the store reopened without it (the simulator's seed 4022 with --coord).
TEST_F(DeltaHistoryTest, AnIndexThatCannotBeWrittenLeavesTheChainAsItWas) {
  const Lineage l = MakeLineage(3);
  const auto v = [&](size_t k) { return l.Manifest(k).VersionId(); };
  DeltaHistory history(dir_ / "history", 1);
  std::unique_ptr<Spool> first, second;
  const ChainLink link0 = SpoolDelta(l, 0, &first);
  ASSERT_TRUE(history.AddFile(first->path(), link0).ok());
  const ChainLink link1 = SpoolDelta(l, 1, &second);
  fs::create_directories(dir_ / "history" / "history.tmp");
  EXPECT_FALSE(history.AddFile(second->path(), link1).ok());
  EXPECT_TRUE(history.Chain(v(1), v(2)).empty());
  EXPECT_EQ(history.Chain(v(0), v(1)).size(), 1u);         // not evicted either
  EXPECT_TRUE(history.Read(v(1), link0.chunks - 1).ok());  // nor its file
  fs::remove_all(dir_ / "history" / "history.tmp");
  ASSERT_TRUE(history.AddFile(second->path(), link1).ok());
  DeltaHistory reopened(dir_ / "history", 1);
  EXPECT_EQ(reopened.Chain(v(1), v(2)).size(), 1u);
  EXPECT_TRUE(reopened.Chain(v(0), v(1)).empty());
}

TEST(CatchUpProtocolTest, RequestsAndAnswersRoundTripAndAreRenumbered) {
  const Digest128 a = Hash128(AsBytes("a")), b = Hash128(AsBytes("b"));
  auto fc = ParseFetchChain(EncodeFetchChain({7, a, b}));
  ASSERT_TRUE(fc.ok());
  EXPECT_EQ(fc->from, a);
  EXPECT_EQ(fc->to, b);
  Chain chain{9, true, {{a, b, 4096, 12}}};
  auto c = ParseChain(EncodeChain(chain));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->links.size(), 1u);
  EXPECT_EQ(c->links[0].chunks, 12u);
  EXPECT_EQ(c->links[0].partition_bytes, 4096u);
  auto fd = ParseFetchDeltaChunk(EncodeFetchDeltaChunk({11, b, 3}));
  ASSERT_TRUE(fd.ok());
  EXPECT_EQ(fd->sequence, 3u);
  auto fm = ParseFetchManifest(EncodeFetchManifest({13, b, a}));
  ASSERT_TRUE(fm.ok());
  EXPECT_EQ(fm->from, a);
  // Relays renumber requests and answers in place.
  const auto request = EncodeFetchDeltaChunk({11, b, 3});
  EXPECT_EQ(RequestIdOf(request), 11u);
  auto renumbered = ParseFetchDeltaChunk(WithRequestId(request, 99));
  ASSERT_TRUE(renumbered.ok());
  EXPECT_EQ(renumbered->request_id, 99u);
  EXPECT_EQ(renumbered->target, b);
  // A chain claiming more deltas than allowed is refused.
  auto bad = EncodeChain(chain);
  bad[kMessageHeaderBytes + 9] = std::byte{200};
  EXPECT_NE(ParseChain(bad).status().message().find("200 deltas"), std::string::npos);
  auto found = ParseDeltaChunk(EncodeDeltaChunk(5, true, AsBytes("xyz")));
  ASSERT_TRUE(found.ok());
  EXPECT_TRUE(found->found);
  EXPECT_EQ(found->bytes.size(), 3u);
}

}  // namespace
}  // namespace deltacast::relay
