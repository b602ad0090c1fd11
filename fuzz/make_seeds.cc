// Writes fuzz/corpus/<target>/ seeds: valid inputs of every kind a fuzz target
// reads, made by deltacast's own encoders, so the fuzzer starts from the formats
// rather than from nothing. Usage: fuzz_make_seeds CORPUS_DIR [CONFIGS_DIR]
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "apply/safetensors.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "relay/producers/producer_protocol.h"
#include "relay/wire/protocol.h"
#include "relay/wire/signing.h"
#include "transport/tcp/frame.h"

namespace fs = std::filesystem;
using namespace deltacast;
using namespace deltacast::relay;

namespace {

fs::path root;

void Write(const std::string& target, const std::string& name, const std::vector<std::byte>& b,
           int mode = -1) {
  fs::create_directories(root / target);
  std::ofstream out(root / target / name, std::ios::binary);
  if (mode >= 0) out.put(static_cast<char>(mode));
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<std::byte> Bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()),
          reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds CORPUS_DIR [CONFIGS_DIR]\n");
    return 2;
  }
  root = argv[1];
  std::mt19937 rng(17);

  // Two small versions of three tensors of different dtypes.
  std::vector<TensorSpec> tensors = {{"a.weight", DType::kBF16, {256}},
                                     {"b.bias", DType::kF32, {4, 8}},
                                     {"c.ids", DType::kI64, {16}}};
  std::vector<std::vector<std::byte>> base, target;
  for (const auto& t : tensors) {
    std::vector<std::byte> b(t.ByteSize());
    for (auto& x : b) x = std::byte(rng());
    auto n = b;
    for (size_t i = 0; i < n.size(); i += 7) n[i] ^= std::byte{1};
    base.push_back(b);
    target.push_back(n);
  }
  auto manifest_of = [&](const std::vector<std::vector<std::byte>>& data) {
    return codec::ComputeManifest(
        tensors, [&](size_t i) { return ByteSpan(data[i]); }, 256, 1);
  };
  const auto base_manifest = manifest_of(base), target_manifest = manifest_of(target);

  // chunk: every chunk of two deltas (fast and context mode), as is and fixed up.
  int n = 0;
  std::vector<std::vector<std::byte>> chunk_messages;
  for (const auto mode : {codec::CodecMode::kFast, codec::CodecMode::kContext}) {
    codec::DeltaEncoderOptions options;
    options.chunk_bytes = 4096;
    options.threads = 1;
    options.codec.mode = mode;
    (void)codec::EncodeDelta(
        base_manifest, target_manifest, [&](size_t i) { return ByteSpan(base[i]); },
        [&](size_t i) { return ByteSpan(target[i]); }, Digest128{}, options,
        [&](std::vector<std::byte>&& chunk) {
          Write("chunk", "delta" + std::to_string(n++), chunk, 0);
          chunk_messages.push_back(EncodeChunk(chunk));
          return Status::Ok();
        });
  }

  // manifest
  Write("manifest", "base", base_manifest.Serialize(), 0);
  Write("manifest", "target", target_manifest.Serialize(), 1);

  // safetensors: a file as deltacast writes it, one with metadata, an empty one.
  auto file = apply::SerializeSafetensorsHeader(tensors, {});
  for (const auto& b : base) file.insert(file.end(), b.begin(), b.end());
  Write("safetensors", "three_tensors", file);
  auto meta = apply::SerializeSafetensorsHeader({{"x", DType::kU8, {3}}}, {{"format", "pt"}});
  meta.insert(meta.end(), 3, std::byte{9});
  Write("safetensors", "metadata", meta);
  Write("safetensors", "empty", apply::SerializeSafetensorsHeader({}, {}));

  // checkpoint_index
  Write(
      "checkpoint_index", "index",
      Bytes(
          R"({"metadata":{"total_size":1024},"weight_map":{"a.weight":"model-00001-of-00002.safetensors","b.bias":"model-00002-of-00002.safetensors"}})"));

  // cluster_config: the repository's examples, and a minimal one with every table.
  if (argc > 2) {
    for (const auto& entry : fs::directory_iterator(argv[2])) {
      if (entry.path().extension() != ".toml") continue;
      std::ifstream in(entry.path(), std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      Write("cluster_config", entry.path().filename().string(), Bytes(text));
    }
  }
  Write("cluster_config", "all_tables", Bytes(R"([cluster]
name = "c"
[tree]
fanout = 2
chunk_size = "4MiB"
commit_policy = "available"
[limits]
handshake_timeout = "2s"
max_pending_handshakes = 16
[security]
tls = "all"
ca = "ca.crt"
cert = "{node}.crt"
key = "{node}.key"
[[region]]
name = "eu"
wan_bandwidth = "1Gbit"
wan_latency = "20ms"
[[link]]
scope = "cross-region"
transports = ["tcp"]
[[node]]
id = "s"
host = "10.0.0.1"
port = 7600
role = "source"
[[node]]
id = "r1"
host = "10.0.0.2"
port = 7600
region = "eu"
transports = ["ucx", "tcp"]
)"));

  // protocol: one of every message.
  Hello hello;
  hello.node_id = "n1";
  hello.inflight_stream = 0x5eed5eed5eed5eedULL;
  hello.applied_chunks = {0, 1, 2, 5};
  hello.transport = "tcp";
  hello.transports = {"ucx", "tcp"};
  Begin begin{7, base_manifest.VersionId(), target_manifest.VersionId(), 256};
  begin.stream_id = 0x5eed5eed5eed5eedULL;
  const std::vector<std::vector<std::byte>> messages = {
      EncodeChallenge({RandomNonce(), "src"}),
      EncodeHello(hello),
      EncodeWelcome({}),
      EncodeRefuse({"no"}),
      EncodeBegin(begin),
      EncodeCredit({4, 7}),
      EncodePrepared({7, {{"n1", 100, 1.5, 3}}}),
      EncodeFailed({7, "n1", "disk full"}),
      EncodeDecision(MessageType::kCommit, {7, target_manifest.VersionId()}),
      EncodeOutcome(MessageType::kCommitted, {7, 3, {{"a1", 0.002, 1.5}, {"a2", 0.003, 0.2}}}),
      EncodeHeartbeat(),
      EncodeFetch({1, "a.weight", 0, 512, {}}),
      EncodePartition(1, true, Bytes("partition")),
      EncodeFetchManifest({2, target_manifest.VersionId(), base_manifest.VersionId()}),
      EncodeManifest(2, true, target_manifest.Serialize()),
      EncodeFetchChain({3, base_manifest.VersionId(), target_manifest.VersionId()}),
      EncodeChain({3, true, {{base_manifest.VersionId(), target_manifest.VersionId(), 256, 2}}}),
      EncodeFetchDeltaChunk({4, target_manifest.VersionId(), 0}),
      EncodeDeltaChunk(4, true, chunk_messages.front()),
      EncodeActiveVersion(target_manifest.VersionId(), target_manifest.Serialize()),
  };
  for (size_t i = 0; i < messages.size(); ++i)
    Write("protocol", "m" + std::to_string(i), messages[i]);
  Write("protocol", "chunk", chunk_messages.front());

  // producer_protocol: one of every root <-> producer message.
  Coverage coverage;
  coverage.refit_id = 7;
  coverage.tensors = tensors;
  coverage.shares = {{0, 0, 64, 128}, {1, 0, 32, 32}};
  coverage.base_pieces = {PartitionHash{1, 2}, PartitionHash{3, 4}};
  Produced produced;
  produced.refit_id = 7;
  produced.chunks = 1;
  produced.pieces = 1;
  produced.piece_messages = 1;
  produced.changes = {{0, 0, PartitionHash{5, 6}, false}, {1, 0, PartitionHash{7, 8}, true}};
  SharePiece piece;
  piece.tensor = 0;
  piece.partition = 0;
  piece.encoded.encoding = codec::Encoding::kSparseXor;
  piece.encoded.change_count = 2;
  piece.encoded.raw_size = 8;
  piece.encoded.payload = Bytes("piecebytes");
  const std::vector<std::vector<std::byte>> producer_messages = {
      EncodeProduce({7, 256, 4096, true}),
      EncodeCoverage(coverage),
      EncodeBaseHashes({7, {PartitionHash{1, 1}, PartitionHash{}}}),
      EncodeProduced(produced),
      EncodePull({7, 2}),
      EncodeShardChunk(7, ChunkOf(chunk_messages.front())),
      EncodePieces(7, std::span<const SharePiece>(&piece, 1)),
      EncodeProduceEnd({7, true, "committed"}),
  };
  for (size_t i = 0; i < producer_messages.size(); ++i)
    Write("producer_protocol", "m" + std::to_string(i), producer_messages[i]);

  // tcp_frame and tcp_reader: a hello, a data frame, a goodbye.
  std::vector<std::byte> stream(transport::kFrameHeaderSize + transport::kHelloSize);
  transport::EncodeFrameHeader({transport::FrameType::kHello, transport::kHelloSize, 0},
                               std::span<std::byte, transport::kFrameHeaderSize>(
                                   stream.data(), transport::kFrameHeaderSize));
  transport::EncodeHello({42, 0, 1, 1 << 20},
                         std::span<std::byte, transport::kHelloSize>(
                             stream.data() + transport::kFrameHeaderSize, transport::kHelloSize));
  const auto payload = messages[1];
  std::vector<std::byte> frame(transport::kFrameHeaderSize);
  transport::EncodeFrameHeader({transport::FrameType::kData, payload.size(), 0},
                               std::span<std::byte, transport::kFrameHeaderSize>(frame.data(), 24));
  stream.insert(stream.end(), frame.begin(), frame.end());
  stream.insert(stream.end(), payload.begin(), payload.end());
  std::vector<std::byte> goodbye(transport::kFrameHeaderSize);
  transport::EncodeFrameHeader(
      {transport::FrameType::kGoodbye, 0, 1},
      std::span<std::byte, transport::kFrameHeaderSize>(goodbye.data(), 24));
  stream.insert(stream.end(), goodbye.begin(), goodbye.end());
  Write("tcp_frame", "hello_data_goodbye", stream);
  Write("tcp_reader", "plain", stream, 0);
  Write("tcp_reader", "authenticated", stream, 1);
  return 0;
}
