#include "relay/protocol.h"

#include <gtest/gtest.h>

namespace deltacast::relay {
namespace {

TEST(ProtocolTest, MessagesRoundTrip) {
  Begin begin{42, Hash128(AsBytes("a")), Hash128(AsBytes("b")), 4096};
  auto b = ParseBegin(EncodeBegin(begin));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->refit_id, 42u);
  EXPECT_EQ(b->target_version, begin.target_version);

  Prepared prepared{7, {{"n1", 100, 1.5, 3}, {"n2", 200, 2.5, 4}}};
  auto p = ParsePrepared(EncodePrepared(prepared));
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->nodes.size(), 2u);
  EXPECT_EQ(p->nodes[1].node_id, "n2");
  EXPECT_DOUBLE_EQ(p->nodes[1].apply_seconds, 2.5);

  auto d = ParseDecision(EncodeDecision(MessageType::kAbort, {9, begin.base_version}));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->refit_id, 9u);
  auto o = ParseOutcome(EncodeOutcome(MessageType::kCommitted, {9, 31}));
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->nodes, 31u);
  auto chunk = EncodeChunk(AsBytes("chunk bytes"));
  EXPECT_EQ(*PeekType(chunk), MessageType::kChunk);
  EXPECT_EQ(AsChars(Body(chunk)), "chunk bytes");
}

TEST(ProtocolTest, HelloCarriesTheHopTransports) {
  Hello hello;
  hello.node_id = "child";
  hello.applied_chunks = {1, 5};
  hello.transport = "tcp";
  hello.transports = {"ucx", "tcp"};
  auto h = ParseHello(EncodeHello(hello));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->applied_chunks, (std::vector<uint32_t>{1, 5}));
  EXPECT_EQ(h->transport, "tcp");
  EXPECT_EQ(h->transports, (std::vector<std::string>{"ucx", "tcp"}));
  // A count above the limit is refused before reading the names.
  auto bytes = EncodeHello(hello);
  const size_t count_at = bytes.size() - (2 + 3) - (2 + 3) - 1;
  ASSERT_EQ(bytes[count_at], std::byte{2});
  bytes[count_at] = std::byte{200};
  EXPECT_NE(ParseHello(bytes).status().message().find("200 transports"), std::string::npos);
}

TEST(ProtocolTest, MalformedMessagesAreRefused) {
  auto good = EncodeCredit({3});
  auto bad_magic = good;
  bad_magic[0] = std::byte{0};
  EXPECT_EQ(PeekType(bad_magic).status().code(), StatusCode::kCorrupt);
  auto bad_version = good;
  bad_version[4] = std::byte{9};
  EXPECT_NE(PeekType(bad_version).status().message().find("version 9"), std::string::npos);
  auto bad_type = good;
  bad_type[5] = std::byte{200};
  EXPECT_NE(PeekType(bad_type).status().message().find("unknown message type"), std::string::npos);
  auto reserved = good;
  reserved[6] = std::byte{1};
  EXPECT_EQ(PeekType(reserved).status().code(), StatusCode::kCorrupt);

  auto truncated = good;
  truncated.pop_back();
  EXPECT_NE(ParseCredit(truncated).status().message().find("truncated"), std::string::npos);
  auto trailing = good;
  trailing.push_back(std::byte{0});
  EXPECT_NE(ParseCredit(trailing).status().message().find("trailing"), std::string::npos);
  // A message of one type is not parsed as another.
  EXPECT_NE(ParseBegin(good).status().message().find("expected BEGIN"), std::string::npos);
  // A PREPARED claiming more nodes than it can hold is refused before allocating.
  auto prepared = EncodePrepared({1, {}});
  StoreLE<uint32_t>(prepared.data() + kMessageHeaderBytes + 8, 0xFFFFFFFFu);
  EXPECT_EQ(ParsePrepared(prepared).status().code(), StatusCode::kCorrupt);
}

TEST(ProtocolTest, FetchCarriesTheSixteenBytePartitionHashAndVersionOneIsRefused) {
  Fetch fetch{5, "layer0.weight", 4096, 8192, HashPartition(AsBytes("partition bytes"))};
  const auto bytes = EncodeFetch(fetch);
  auto f = ParseFetch(bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->tensor, "layer0.weight");
  EXPECT_EQ(f->byte_length, 8192u);
  EXPECT_EQ(f->hash, fetch.hash);
  // request id, name, offset, length, then the hash's 16 bytes: nothing after.
  EXPECT_EQ(bytes.size(), kMessageHeaderBytes + 8 + 2 + 13 + 8 + 8 + 16);
  // A peer of protocol version 1 (8-byte hashes) is refused, never misread.
  auto old = bytes;
  old[4] = std::byte{1};
  EXPECT_NE(PeekType(old).status().message().find("version 1"), std::string::npos);
}

TEST(ProtocolTest, ProofBindsTokenNonceAndBothEnds) {
  auto nonce = RandomNonce();
  auto proof = HelloProof("secret", nonce, "child", "parent");
  EXPECT_TRUE(ProofMatches(proof, HelloProof("secret", nonce, "child", "parent")));
  EXPECT_FALSE(ProofMatches(proof, HelloProof("wrong", nonce, "child", "parent")));
  EXPECT_FALSE(ProofMatches(proof, HelloProof("secret", RandomNonce(), "child", "parent")));
  EXPECT_FALSE(ProofMatches(proof, HelloProof("secret", nonce, "other", "parent")));
  EXPECT_FALSE(ProofMatches(proof, HelloProof("secret", nonce, "child", "other")));
}

}  // namespace
}  // namespace deltacast::relay
