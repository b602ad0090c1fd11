// One delta streamed again after an aborted refit, numbered differently, and a delta
// to a target some other delta was refused for: a node names a spooled chunk by its
// delta's target and sequence, so what an earlier stream left in its spool must not
// stand in for this stream's chunks (a node applies a chunk it no longer buffers
// from its spool). A root numbers its chunks in the order its producers deliver
// them, so two refits of one delta need not agree on chunk N.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "apply/host_store.h"
#include "apply/replica.h"
#include "codec/chunk.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/source.h"
#include "relay/wire/protocol.h"
#include "tests/relay/tree/security_util.h"
#include "topology/cluster_config.h"
#include "transport/inproc/inproc_transport.h"

namespace deltacast::relay {
namespace {

constexpr char kToken[] = "restream-test-token";
constexpr uint64_t kPartitionBytes = 8 << 10;
constexpr int kReceivers = 3;  // n1 (relay of n3) and n2 under the source

// A short commit timeout: a node that was catching up when the refused refit's ABORT
// passed it never confirms that ABORT, and its parent waits this long for it.
std::string ConfigToml(const std::string& policy, const std::string& commit_timeout) {
  std::string toml =
      "[cluster]\nname = \"restream-test\"\n\n[tree]\nfanout = 2\nchunk_size = \"4KiB\"\n"
      "window = 4\nconnect_timeout = \"5s\"\ncommit_timeout = \"" +
      commit_timeout + "\"\ncommit_policy = \"" + policy +
      "\"\n\n"
      "[[node]]\nid = \"src\"\nhost = \"mem\"\nport = 1\nregion = \"r\"\nrole = \"source\"\n";
  for (int i = 1; i <= kReceivers; ++i) {
    toml += "\n[[node]]\nid = \"n" + std::to_string(i) +
            "\"\nhost = \"mem\"\nport = " + std::to_string(1 + 3 * i) +
            "\nregion = \"r\"\nrole = \"receiver\"\n";
  }
  return toml;
}

using Tensors = std::vector<std::vector<std::byte>>;

// `from` with ~3 % of its BF16 elements changed.
Tensors Changed(const Tensors& from, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensors out = from;
  for (auto& t : out) {
    for (size_t i = 0; i < t.size(); i += 2) {
      if (rng() % 100 < 3) t[i] ^= std::byte{1};
    }
  }
  return out;
}

class RestreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(5);
    for (int t = 0; t < 3; ++t) {
      tensors_.push_back({"layer" + std::to_string(t) + ".weight", DType::kBF16, {1 << 18}});
      std::vector<std::byte> b(size_t{2} << 18);
      for (auto& x : b) x = std::byte(rng());
      base_.push_back(std::move(b));
    }
    target_ = Changed(base_, 6);
    auto config =
        topology::ParseClusterConfig(ConfigToml(policy_, commit_timeout_), "restream-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    network_ = std::make_shared<transport::InprocNetwork>();
    stores_.assign(kReceivers, base_);
    for (int i = 0; i < kReceivers; ++i) {
      auto replica = apply::Replica::ForStore(Borrow(stores_[i]), kPartitionBytes, 1);
      ASSERT_TRUE(replica.ok());
      NodeAgentOptions options;
      options.config = config_;
      options.node_id = "n" + std::to_string(i + 1);
      options.token = kToken;
      options.apply_threads = 2;
      auto agent = NodeAgent::Start(std::move(options), std::move(*replica),
                                    transport::MakeInprocTransport(network_));
      ASSERT_TRUE(agent.ok()) << agent.status().ToString();
      agents_.push_back(std::move(*agent));
    }
    PublishOptions options;
    options.config = config_;
    options.token = kToken;
    options.keep_deltas = 0;
    auto source = Source::Start(std::move(options), transport::MakeInprocTransport(network_));
    ASSERT_TRUE(source.ok()) << source.status().ToString();
    source_ = std::move(*source);
  }

  void TearDown() override {
    if (source_) source_->Stop();
    for (auto& a : agents_) a->Stop();
  }

  std::unique_ptr<apply::WeightStore> Borrow(Tensors& buffers) {
    std::vector<std::pair<TensorSpec, MutableByteSpan>> spans;
    for (size_t i = 0; i < tensors_.size(); ++i)
      spans.emplace_back(tensors_[i], MutableByteSpan(buffers[i]));
    return std::move(*apply::HostStore::Borrow(std::move(spans)));
  }

  codec::Manifest ManifestOf(const Tensors& t) {
    return codec::ComputeManifest(
        tensors_, [&](size_t i) { return ByteSpan(t[i]); }, kPartitionBytes, 1);
  }

  // The delta's chunks as the source's encoder makes them (data chunks, then END).
  std::vector<std::vector<std::byte>> Encode(const Tensors& from, const Tensors& to) {
    codec::DeltaEncoderOptions o;
    o.chunk_bytes = config_.tree.chunk_size;
    o.threads = 1;
    std::vector<std::vector<std::byte>> chunks;
    Status s = codec::EncodeDelta(
        ManifestOf(from), ManifestOf(to), [&](size_t i) { return ByteSpan(from[i]); },
        [&](size_t i) { return ByteSpan(to[i]); }, Digest128{}, o,
        [&](std::vector<std::byte>&& c) {
          chunks.push_back(std::move(c));
          return Status::Ok();
        });
    EXPECT_TRUE(s.ok()) << s.ToString();
    return chunks;
  }

  void ExpectStoresAre(const Tensors& version, const char* what) {
    for (int i = 0; i < kReceivers; ++i) {
      for (size_t t = 0; t < tensors_.size(); ++t) {
        EXPECT_TRUE(stores_[i][t] == version[t])
            << "n" << i + 1 << " tensor " << t << " is not " << what;
      }
    }
  }

  std::string policy_ = "all";
  std::string commit_timeout_ = "5s";
  std::vector<TensorSpec> tensors_;
  Tensors base_, target_;
  topology::ClusterConfig config_;
  std::shared_ptr<transport::InprocNetwork> network_;
  std::vector<Tensors> stores_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  std::unique_ptr<Source> source_;
};

TEST_F(RestreamTest, AnAbortedDeltaStreamedAgainInAnotherOrderCommitsBitExact) {
  const auto chunks = Encode(base_, target_);
  const size_t data = chunks.size() - 1;
  ASSERT_GE(data, 8u);
  const codec::Manifest base = ManifestOf(base_), target = ManifestOf(target_);
  // First refit: a few chunks, which every node spools and applies, then the
  // stream fails (a producer lost) and the refit aborts.
  auto first = source_->PublishStream(
      base, target, [&](const Source::ChunkMessageSink& sink, codec::DeltaStats*) -> Status {
        for (size_t i = 0; i < 3; ++i) RETURN_IF_ERROR(sink(EncodeChunk(chunks[i])));
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        return Status::Aborted("a producer was lost");
      });
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->committed);
  ExpectStoresAre(base_, "the base after the abort");
  // Second refit of the same delta: the data chunks in reverse, renumbered, so
  // chunk N holds other records than the first stream's chunk N.
  auto second = source_->PublishStream(
      base, target, [&](const Source::ChunkMessageSink& sink, codec::DeltaStats*) -> Status {
        for (size_t n = 0; n < data; ++n) {
          std::vector<std::byte> c = chunks[data - 1 - n];
          RETURN_IF_ERROR(
              codec::RestampChunk(c, {base.VersionId(), target.VersionId(), kPartitionBytes},
                                  static_cast<uint32_t>(n)));
          RETURN_IF_ERROR(sink(EncodeChunk(c)));
        }
        return sink(EncodeChunk(chunks.back()));
      });
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(second->committed) << second->abort_reason;
  ExpectStoresAre(target_, "the target");
}

// The root killed mid-refit while every node holds part of the delta (its first
// chunks applied and journaled), restarted, and the same delta streamed again
// numbered otherwise (a root numbers chunks as its producers deliver them). The
// nodes rejoin the new root while it waits for them, so their HELLOs name the old
// stream's chunks: those sequence numbers mean other records now.
TEST_F(RestreamTest, ARootRestartedMidRefitThatRenumbersTheDeltaCommitsBitExact) {
  const auto chunks = Encode(base_, target_);
  const size_t data = chunks.size() - 1;
  ASSERT_GE(data, 8u);
  const codec::Manifest base = ManifestOf(base_), target = ManifestOf(target_);
  auto options = [&] {
    PublishOptions o;
    o.config = config_;
    o.token = kToken;
    o.keep_deltas = 0;
    return o;
  };
  // The root that dies: its transport is shut down under it (its links close, it
  // decides nothing the nodes hear), as a killed process's would be.
  source_->Stop();
  auto transport = transport::MakeInprocTransport(network_);
  transport::Transport* dying_transport = transport.get();
  auto dying = Source::Start(options(), std::move(transport));
  ASSERT_TRUE(dying.ok()) << dying.status().ToString();
  constexpr size_t kHeld = 4;
  std::mutex mu;
  std::condition_variable cv;
  bool release_first = false;
  std::thread first([&] {
    (void)(*dying)->PublishStream(
        base, target, [&](const Source::ChunkMessageSink& sink, codec::DeltaStats*) -> Status {
          for (size_t i = 0; i < kHeld; ++i) RETURN_IF_ERROR(sink(EncodeChunk(chunks[i])));
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return release_first; });
          return Status::Aborted("the root was killed");
        });
  });
  auto release = [&] {
    {
      std::lock_guard lock(mu);
      release_first = true;
    }
    cv.notify_all();
    if (first.joinable()) first.join();
    (*dying)->Stop();
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto all_hold = [&] {
    for (const auto& a : agents_)
      if (a->stats().chunks_received < kHeld) return false;
    return true;
  };
  while (!all_hold() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!all_hold()) release();
  ASSERT_TRUE(all_hold()) << "the nodes did not apply the first stream's chunks";
  dying_transport->Shutdown();
  auto restarted = Source::Start(options(), transport::MakeInprocTransport(network_));
  if (!restarted.ok()) release();
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  // The same delta, the data chunks in reverse and renumbered: sequence N of this
  // stream is another chunk than sequence N of the first. Published at once, so
  // the nodes rejoin while it waits for them and their HELLOs name the old chunks.
  auto second =
      (*restarted)
          ->PublishStream(base, target,
                          [&](const Source::ChunkMessageSink& sink, codec::DeltaStats*) -> Status {
                            for (size_t n = 0; n < data; ++n) {
                              std::vector<std::byte> c = chunks[data - 1 - n];
                              RETURN_IF_ERROR(codec::RestampChunk(
                                  c, {base.VersionId(), target.VersionId(), kPartitionBytes},
                                  static_cast<uint32_t>(n)));
                              RETURN_IF_ERROR(sink(EncodeChunk(c)));
                            }
                            return sink(EncodeChunk(chunks.back()));
                          });
  release();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(second->committed) << second->abort_reason;
  ExpectStoresAre(target_, "the target");
  uint64_t rolled_back = 0;
  for (const auto& a : agents_) {
    EXPECT_EQ(a->stats().chunk_bytes_resent, 0u) << "a chunk of one stream was sent twice";
    rolled_back += a->stats().stream_rollbacks;
  }
  // The nodes rejoined while the new stream was under way (not before it, which
  // would have told them ABORT): they met the old numbering and rolled it back.
  EXPECT_GT(rolled_back, 0u);
  (*restarted)->Stop();
}

TEST_F(RestreamTest, ADeltaToATargetAnotherDeltaWasRefusedForCommits) {
  // The nodes hold base_; a delta from another version to the same target is
  // refused (its chunks are spooled all the same), then base_ -> target commits.
  Tensors other = Changed(base_, 7);
  auto other_store = Borrow(other);
  auto base_store = Borrow(base_);
  auto target_store = Borrow(target_);
  auto refused =
      source_->Publish(*other_store, ManifestOf(other), *target_store, ManifestOf(target_));
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_FALSE(refused->committed);
  ExpectStoresAre(base_, "left at the base");
  auto report =
      source_->Publish(*base_store, ManifestOf(base_), *target_store, ManifestOf(target_));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  ExpectStoresAre(target_, "the target");
}

// A delta whose record cannot take its partition from the base to the target BEGIN
// announced (a trainer's mistake the root did not catch; here forged): every node
// refuses to prepare once, saying it is the delta, not the link, and the refit fails
// at once, even under policy `available`, which would leave out a node that merely
// cannot take part. Nothing is written anywhere.
class BadDeltaTest : public RestreamTest {
 protected:
  void SetUp() override {
    policy_ = "available";
    commit_timeout_ = "60s";
    RestreamTest::SetUp();
  }
};

TEST_F(BadDeltaTest, ARecordThatMissesItsTargetFailsTheRefitAtOnceUnderEitherPolicy) {
  const codec::Manifest base = ManifestOf(base_);
  codec::Manifest target = ManifestOf(target_);
  // The announced target of tensor 0's first partition is not where its record leads.
  target.partition_hashes[0][0] ^= PartitionHash{1, 0};
  const codec::DeltaIdentity identity{base.VersionId(), target.VersionId(), kPartitionBytes};
  const uint64_t elements = kPartitionBytes / 2;
  codec::CodecScratch scratch;
  auto encoded = codec::EncodePartition(DType::kBF16, ByteSpan(base_[0]).first(kPartitionBytes),
                                        ByteSpan(target_[0]).first(kPartitionBytes),
                                        codec::EncodeOptions{}, scratch);
  ASSERT_TRUE(encoded.has_value());
  codec::ChunkBuilder chunk(identity, 0);
  chunk.Add(tensors_[0].name, DType::kBF16, 0, elements, base.partition_hashes[0][0],
            target.partition_hashes[0][0], *encoded);
  const auto start = std::chrono::steady_clock::now();
  auto report = source_->PublishStream(
      base, target, [&](const Source::ChunkMessageSink& sink, codec::DeltaStats*) -> Status {
        RETURN_IF_ERROR(sink(EncodeChunk(chunk.Finish())));
        return sink(EncodeChunk(codec::BuildEndChunk(
            identity, 1, codec::DeltaSummary{Digest128{}, 1, 1, target.TotalBytes(), 1})));
      });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->committed) << "committed a delta no node could apply";
  EXPECT_NE(report->abort_reason.find("bad delta"), std::string::npos) << report->abort_reason;
  EXPECT_NE(report->abort_reason.find("node 'n"), std::string::npos) << report->abort_reason;
  EXPECT_LT(seconds, 30) << "waited for the commit timeout (60 s)";
  // A node that said FAILED is not waited for: it rolls back on its own.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (stores_ != std::vector<Tensors>(kReceivers, base_) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ExpectStoresAre(base_, "the base");
  // At most its first join: a node below may not have joined yet when the refit failed.
  for (const auto& a : agents_) {
    EXPECT_LE(a->stats().parent_joins, 1u) << "a node reconnected to fetch the delta again";
  }
}

// A root that relays producers' pieces (PublishStream without the versions' stores)
// holds no bytes of either version, so it serves no manifest: a node that took one
// would catch up by partitions nobody serves, and stop half way, its delta in flight
// no longer the first of the chain of kept deltas that would have taken it there (the
// simulator's --producers seed 439). With the stores it serves the manifest. The test
// plays n2 and asks during each refit.
class ManifestServedTest : public RestreamTest {
 protected:
  void SetUp() override {
    policy_ = "available";
    commit_timeout_ = "2s";  // n2 never prepares: each refit aborts after this
    RestreamTest::SetUp();
  }
};

TEST_F(ManifestServedTest, ARootWithoutTheVersionsBytesServesNoManifestOneWithThemDoes) {
  agents_[1]->Stop();  // n2: the test plays it
  auto client = transport::MakeInprocTransport(network_);
  testing::ChildPeer child(*client, "mem:1", "n2", "src", kToken);
  ASSERT_TRUE(child.joined());
  const codec::Manifest base = ManifestOf(base_), target = ManifestOf(target_);
  const auto chunks = Encode(base_, target_);
  // Streams the delta after asking for the base's manifest; `found` gets the answer.
  auto asking = [&](std::optional<bool>& found, uint64_t id) {
    return [&, id](const Source::ChunkMessageSink& sink, codec::DeltaStats*) -> Status {
      child.Send(EncodeFetchManifest({id, base.VersionId(), base.VersionId()}));
      if (auto answer = child.Next(MessageType::kManifest, std::chrono::seconds(10))) {
        auto m = ParseManifest(**answer);
        if (m.ok() && m->request_id == id) found = m->found;
      }
      for (const auto& c : chunks) RETURN_IF_ERROR(sink(EncodeChunk(c)));
      return Status::Ok();
    };
  };
  std::optional<bool> without_bytes, with_bytes;
  auto first = source_->PublishStream(base, target, asking(without_bytes, 1));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Tensors base_copy = base_, target_copy = target_;
  auto base_store = Borrow(base_copy), target_store = Borrow(target_copy);
  auto second = source_->PublishStream(base, target, asking(with_bytes, 2), base_store.get(),
                                       target_store.get());
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE(without_bytes.has_value()) << "no answer without the stores";
  ASSERT_TRUE(with_bytes.has_value()) << "no answer with the stores";
  EXPECT_FALSE(*without_bytes);
  EXPECT_TRUE(*with_bytes);
}

}  // namespace
}  // namespace deltacast::relay
