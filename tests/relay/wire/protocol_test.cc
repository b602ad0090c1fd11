#include "relay/wire/protocol.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace deltacast::relay {
namespace {

TEST(ProtocolTest, MessagesRoundTrip) {
  Begin begin{42, Hash128(AsBytes("a")), Hash128(AsBytes("b")), 4096};
  auto b = ParseBegin(EncodeBegin(begin));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->refit_id, 42u);
  EXPECT_EQ(b->target_version, begin.target_version);
  EXPECT_EQ(b->stream_id, 0u);

  Prepared prepared{7, {{"n1", 100, 1.5, 3}, {"n2", 200, 2.5, 4}}};
  auto p = ParsePrepared(EncodePrepared(prepared));
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->nodes.size(), 2u);
  EXPECT_EQ(p->nodes[1].node_id, "n2");
  EXPECT_DOUBLE_EQ(p->nodes[1].apply_seconds, 2.5);

  auto d = ParseDecision(EncodeDecision(MessageType::kAbort, {9, begin.base_version}));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->refit_id, 9u);
  Failed failed{9, "n3", "bad delta: chunk 4 refused", FailureKind::kBadDelta};
  auto f = ParseFailed(EncodeFailed(failed));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->kind, FailureKind::kBadDelta);
  EXPECT_EQ(f->reason, failed.reason);
  auto unknown_kind = EncodeFailed(failed);
  unknown_kind.back() = std::byte{2};
  EXPECT_EQ(ParseFailed(unknown_kind).status().code(), StatusCode::kCorrupt);
  auto o = ParseOutcome(EncodeOutcome(MessageType::kCommitted, {9, 31, {{"n1", 0.25, 3.5}}}));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->nodes, 31u);
  ASSERT_EQ(o->pauses.size(), 1u);
  EXPECT_EQ(o->pauses[0].node_id, "n1");
  EXPECT_EQ(o->pauses[0].pause_seconds, 0.25);
  EXPECT_EQ(o->pauses[0].hold_seconds, 3.5);
  // A pause report that lies (a negative time, a count beyond the message) is refused.
  auto negative = EncodeOutcome(MessageType::kCommitted, {9, 1, {{"n1", -1.0, 0}}});
  EXPECT_EQ(ParseOutcome(negative).status().code(), StatusCode::kCorrupt);
  auto many = EncodeOutcome(MessageType::kAborted, {9, 1, {}});
  many[many.size() - 4] = std::byte{0xff};  // the pause count
  EXPECT_EQ(ParseOutcome(many).status().code(), StatusCode::kCorrupt);
  auto chunk = EncodeChunk(AsBytes("chunk bytes"));
  EXPECT_EQ(*PeekType(chunk), MessageType::kChunk);
  EXPECT_EQ(AsChars(ChunkOf(chunk)), "chunk bytes");
  EXPECT_EQ(chunk.size(), kMessageHeaderBytes + 11 + kSignatureBytes);
  // Framed in the chunk's own buffer: the same message, not copied.
  const ByteSpan body = AsBytes("chunk bytes");
  std::vector<std::byte> in_place;
  in_place.reserve(kMessageHeaderBytes + body.size() + kSignatureBytes);
  in_place.resize(kMessageHeaderBytes + body.size());
  std::copy(body.begin(), body.end(), in_place.begin() + kMessageHeaderBytes);
  const std::byte* buffer = in_place.data();
  auto framed = FrameChunk(std::move(in_place));
  EXPECT_EQ(framed, chunk);
  EXPECT_EQ(framed.data(), buffer);
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
  // Before the names, and the stripe (index, count) at the end.
  const size_t count_at = bytes.size() - 2 - (2 + 3) - (2 + 3) - 1;
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
  bad_version[4] = std::byte{kProtocolVersion + 1};
  EXPECT_NE(PeekType(bad_version)
                .status()
                .message()
                .find("version " + std::to_string(kProtocolVersion + 1)),
            std::string::npos);
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

// Version 6: PREPARED carries where each node's time went; a time that is not a
// finite count of seconds >= 0 is refused, and a version-5 PREPARED (without them)
// is refused at its header, never misread.
TEST(ProtocolTest, PreparedCarriesEachNodesPhasesAndVersionFiveIsRefused) {
  NodeReport n{"n1", 100, 9.5, 3};
  n.receive_seconds = 1.25;
  n.check_seconds = 0.5;
  n.write_seconds = 6.75;
  n.apply_cpu_seconds = 2.0;
  n.cpu_wait_seconds = 0.25;
  n.disk_wait_seconds = 4.5;
  const auto bytes = EncodePrepared({7, {n}});
  auto p = ParsePrepared(bytes);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->nodes.size(), 1u);
  const NodeReport& got = p->nodes[0];
  EXPECT_DOUBLE_EQ(got.apply_seconds, 9.5);
  EXPECT_DOUBLE_EQ(got.receive_seconds, 1.25);
  EXPECT_DOUBLE_EQ(got.check_seconds, 0.5);
  EXPECT_DOUBLE_EQ(got.write_seconds, 6.75);
  EXPECT_DOUBLE_EQ(got.apply_cpu_seconds, 2.0);
  EXPECT_DOUBLE_EQ(got.cpu_wait_seconds, 0.25);
  EXPECT_DOUBLE_EQ(got.disk_wait_seconds, 4.5);
  // header, refit id, count, "n1", bytes, seconds, partitions, six phase times
  EXPECT_EQ(bytes.size(), kMessageHeaderBytes + 8 + 4 + 2 + 2 + 8 + 8 + 8 + 6 * 8);
  for (double bad : {-1.0, std::nan(""), 1e300}) {
    NodeReport wrong = n;
    wrong.disk_wait_seconds = bad;
    auto refused = ParsePrepared(EncodePrepared({7, {wrong}}));
    EXPECT_EQ(refused.status().code(), StatusCode::kCorrupt) << bad;
    EXPECT_NE(refused.status().message().find("'n1'"), std::string::npos);
  }
  auto truncated = bytes;
  truncated.resize(truncated.size() - 8);
  EXPECT_EQ(ParsePrepared(truncated).status().code(), StatusCode::kCorrupt);
  auto old = bytes;
  old[4] = std::byte{5};
  EXPECT_NE(PeekType(old).status().message().find("version 5"), std::string::npos);
}

TEST(ProtocolTest, ActiveVersionCarriesTheParentsManifestOnlyWhenAsked) {
  const Digest128 version = Hash128(AsBytes("v"));
  const std::vector<std::byte> manifest(100, std::byte{7});
  auto with = ParseActiveVersion(EncodeActiveVersion(version, manifest));
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  EXPECT_EQ(with->version, version);
  EXPECT_TRUE(with->has_manifest);
  EXPECT_EQ(with->manifest.size(), manifest.size());
  auto without = ParseActiveVersion(EncodeActiveVersion(version, {}));
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  EXPECT_FALSE(without->has_manifest);
  // A flag that lies about the length, and a length past the end, are refused.
  auto lying = EncodeActiveVersion(version, {});
  lying[kMessageHeaderBytes + 16] = std::byte{1};
  EXPECT_EQ(ParseActiveVersion(lying).status().code(), StatusCode::kCorrupt);
  auto cut = EncodeActiveVersion(version, manifest);
  cut.resize(cut.size() - 1);
  EXPECT_EQ(ParseActiveVersion(cut).status().code(), StatusCode::kCorrupt);
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

// Version 9: a chunk is named by the stream that numbered it. BEGIN carries the
// stream id, a HELLO the stream its applied chunks belong to; a version-8 peer (no
// stream anywhere) is refused at the header, never misread; so is a version-9 peer
// (no stripe in HELLO and BEGIN).
TEST(ProtocolTest, BeginAndHelloCarryTheStreamAndVersion9IsRefused) {
  Begin begin{42, Hash128(AsBytes("a")), Hash128(AsBytes("b")), 4096};
  begin.stream_id = 0x0123456789abcdefULL;
  auto b = ParseBegin(EncodeBegin(begin));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->stream_id, begin.stream_id);
  Hello hello;
  hello.node_id = "n1";
  hello.inflight_target = begin.target_version;
  hello.inflight_stream = 0xfedcba9876543210ULL;
  hello.applied_chunks = {0, 1, 2};
  auto h = ParseHello(EncodeHello(hello));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->inflight_stream, hello.inflight_stream);
  EXPECT_EQ(h->applied_chunks, hello.applied_chunks);
  // A BEGIN cut before its stream id is refused, not read with a zero stream.
  auto cut = EncodeBegin(begin);
  cut.resize(cut.size() - kSignatureBytes - 8);
  EXPECT_EQ(ParseBegin(cut).status().code(), StatusCode::kCorrupt);
  for (auto bytes : {EncodeBegin(begin), EncodeHello(hello)}) {
    bytes[4] = std::byte{9};
    const Status refused = PeekType(bytes).status();
    EXPECT_EQ(refused.code(), StatusCode::kCorrupt);
    EXPECT_NE(refused.message().find("protocol version 9 is not supported (this build speaks " +
                                     std::to_string(kProtocolVersion) + ")"),
              std::string::npos)
        << refused.message();
  }
}

// Version 12: BEGIN carries when the source began the refit (it orders two refits
// from one base); a version-11 peer is refused at the header.
TEST(ProtocolTest, BeginCarriesWhenTheSourceBeganItAndVersion11IsRefused) {
  Begin begin{42, Hash128(AsBytes("a")), Hash128(AsBytes("b")), 4096};
  begin.stream_id = 5;
  begin.begun_at_us = 1'764'806'400'123'456ULL;
  auto b = ParseBegin(EncodeBegin(begin));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->begun_at_us, begin.begun_at_us);
  EXPECT_EQ(b->stream_id, 5u);
  auto old = EncodeBegin(begin);
  old[4] = std::byte{11};
  EXPECT_NE(PeekType(old).status().message().find("protocol version 11 is not supported"),
            std::string::npos);
}

// Version 10: HELLO and BEGIN name the stripe of their link (index, count); a
// stripe out of range or a count over kMaxStripes is refused.
TEST(ProtocolTest, BeginAndHelloNameTheirStripe) {
  Begin begin{7, Hash128(AsBytes("a")), Hash128(AsBytes("b")), 4096};
  begin.stream_id = 9;
  begin.stripe = 2;
  begin.stripes = 3;
  auto b = ParseBegin(EncodeBegin(begin));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->stripe, 2u);
  EXPECT_EQ(b->stripes, 3u);
  Hello hello;
  hello.node_id = "n1";
  hello.stripe = 1;
  hello.stripes = 2;
  auto h = ParseHello(EncodeHello(hello));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->stripe, 1u);
  EXPECT_EQ(h->stripes, 2u);
  // Defaults: stripe 0 of 1 (one tree).
  Hello plain;
  plain.node_id = "n2";
  auto p = ParseHello(EncodeHello(plain));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->stripe, 0u);
  EXPECT_EQ(p->stripes, 1u);
  for (auto [stripe, stripes] : {std::pair{2u, 2u}, std::pair{0u, 0u}, std::pair{0u, 65u}}) {
    begin.stripe = hello.stripe = stripe;
    begin.stripes = hello.stripes = stripes;
    const Status bad_begin = ParseBegin(EncodeBegin(begin)).status();
    EXPECT_EQ(bad_begin.code(), StatusCode::kCorrupt);
    EXPECT_NE(bad_begin.message().find("BEGIN names stripe"), std::string::npos);
    EXPECT_EQ(ParseHello(EncodeHello(hello)).status().code(), StatusCode::kCorrupt);
  }
  // Without its stripe bytes (a version-9 body under a version-10 header): truncated.
  begin.stripe = 0;
  begin.stripes = 1;
  auto cut = EncodeBegin(begin);
  cut.resize(cut.size() - 2);
  EXPECT_EQ(ParseBegin(cut).status().code(), StatusCode::kCorrupt);
}

TEST(ProtocolTest, ProofsBindTokenNoncesAndBothEndsAndNeverStandInForEachOther) {
  auto nonce = RandomNonce();
  auto proof = ChildProof("secret", nonce, "child", "parent");
  EXPECT_TRUE(ProofMatches(proof, ChildProof("secret", nonce, "child", "parent")));
  EXPECT_FALSE(ProofMatches(proof, ChildProof("wrong", nonce, "child", "parent")));
  EXPECT_FALSE(ProofMatches(proof, ChildProof("secret", RandomNonce(), "child", "parent")));
  EXPECT_FALSE(ProofMatches(proof, ChildProof("secret", nonce, "other", "parent")));
  EXPECT_FALSE(ProofMatches(proof, ChildProof("secret", nonce, "child", "other")));
  // The parent proves over both nonces; a child's proof (or a reflected one) is not it.
  auto child_nonce = RandomNonce();
  auto parent = ParentProof("secret", nonce, child_nonce, "parent", "child");
  EXPECT_TRUE(ProofMatches(parent, ParentProof("secret", nonce, child_nonce, "parent", "child")));
  EXPECT_FALSE(ProofMatches(parent, ParentProof("wrong", nonce, child_nonce, "parent", "child")));
  EXPECT_FALSE(
      ProofMatches(parent, ParentProof("secret", nonce, RandomNonce(), "parent", "child")));
  EXPECT_FALSE(ProofMatches(parent, ParentProof("secret", nonce, child_nonce, "child", "parent")));
  EXPECT_FALSE(ProofMatches(parent, ChildProof("secret", nonce, "parent", "child")));
  EXPECT_FALSE(ProofMatches(ChildProof("secret", child_nonce, "parent", "child"),
                            ParentProof("secret", nonce, child_nonce, "parent", "child")));
}

TEST(ProtocolTest, WelcomeCarriesTheParentsProof) {
  Welcome welcome{ParentProof("t", RandomNonce(), RandomNonce(), "p", "c")};
  auto w = ParseWelcome(EncodeWelcome(welcome));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(ProofMatches(w->proof, welcome.proof));
  // A version-2 WELCOME (header only) is refused.
  auto bare = EncodeWelcome(welcome);
  bare.resize(kMessageHeaderBytes);
  EXPECT_EQ(ParseWelcome(bare).status().code(), StatusCode::kCorrupt);
}

TEST(ProtocolTest, HelloListsAppliedChunksAsRunsAndRefusesMalformedRuns) {
  Hello hello;
  hello.node_id = "n1";
  hello.nonce = RandomNonce();
  hello.applied_chunks = {9, 1, 2, 3, 7, 8, 3};
  auto h = ParseHello(EncodeHello(hello));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->applied_chunks, (std::vector<uint32_t>{1, 2, 3, 7, 8, 9}));
  EXPECT_EQ(h->nonce, hello.nonce);
  // Three runs of 8 bytes, whatever the number of chunks: 1..3, 7..9.
  Hello many = hello;
  many.applied_chunks.clear();
  for (uint32_t s = 0; s < 100000; ++s) many.applied_chunks.push_back(s);
  EXPECT_LT(EncodeHello(many).size(), 200u);
  // A fragmented set is cut at kMaxAppliedRunsInHello runs: the message stays small.
  Hello fragmented = hello;
  fragmented.applied_chunks.clear();
  for (uint32_t s = 0; s < 2 * kMaxAppliedRunsInHello; ++s)
    fragmented.applied_chunks.push_back(2 * s);
  const auto bytes = EncodeHello(fragmented);
  EXPECT_LT(bytes.size(), 8 * kMaxAppliedRunsInHello + 200);
  auto f = ParseHello(bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->applied_chunks.size(), kMaxAppliedRunsInHello);

  // Runs are located after id, proof, nonce, three digests, the prepared flag and
  // the in-flight stream.
  const size_t runs_at = kMessageHeaderBytes + 2 + 2 + kProofBytes + kNonceBytes + 3 * 16 + 1 + 8;
  auto patch = [&](uint32_t first, uint32_t count) {
    Hello one = hello;
    one.applied_chunks = {5};
    auto b = EncodeHello(one);
    StoreLE<uint32_t>(b.data() + runs_at + 4, first);
    StoreLE<uint32_t>(b.data() + runs_at + 8, count);
    return ParseHello(b).status();
  };
  EXPECT_TRUE(patch(5, 1).ok());
  EXPECT_EQ(patch(5, 0).code(), StatusCode::kCorrupt);            // empty run
  EXPECT_EQ(patch(0xFFFFFFFFu, 2).code(), StatusCode::kCorrupt);  // runs past 2^32
  EXPECT_NE(patch(0, kMaxAppliedInHello + 1).message().find("more than"), std::string::npos);
}

TEST(ProtocolTest, PeerStringsThatAreNotIdsAreRefused) {
  Hello hello;
  hello.node_id = "n1\n2026-01-01 info forged line";
  EXPECT_EQ(ParseHello(EncodeHello(hello)).status().code(), StatusCode::kCorrupt);
  hello.node_id = "n1";
  hello.transport = "tcp\x1b[31m";
  EXPECT_EQ(ParseHello(EncodeHello(hello)).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(ParseChallenge(EncodeChallenge({RandomNonce(), "p\r"})).status().code(),
            StatusCode::kCorrupt);
  EXPECT_TRUE(ValidNodeId("euw-1.a_b"));
  EXPECT_FALSE(ValidNodeId(""));
  EXPECT_FALSE(ValidNodeId(std::string(kMaxNodeIdBytes + 1, 'a')));
}

// Version 11: a parent left out of a refit names it in the REFUSE it sheds its
// children with (docs/protocol.md, "Stripes", "A node left out"); any other REFUSE
// names none. A REFUSE of version 10 (no refit id) is truncated here.
TEST(ProtocolTest, RefuseNamesTheRefitAParentCannotServe) {
  auto shed = ParseRefuse(EncodeRefuse({"'n1' cannot take part in refit 7", 7}));
  ASSERT_TRUE(shed.ok()) << shed.status().ToString();
  EXPECT_EQ(shed->reason, "'n1' cannot take part in refit 7");
  EXPECT_EQ(shed->refit_id, 7u);
  auto plain = ParseRefuse(EncodeRefuse({"wrong token proof"}));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->refit_id, 0u);
  std::vector<std::byte> old = EncodeRefuse({"no", 7});
  old.resize(old.size() - sizeof(uint64_t));
  EXPECT_FALSE(ParseRefuse(old).ok());
}

}  // namespace
}  // namespace deltacast::relay
