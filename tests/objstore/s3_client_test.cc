// The S3 client against a real S3-compatible server (s3rver) on loopback.
#include "objstore/s3_client.h"

#include <fmt/core.h>
#include <gtest/gtest.h>

#include <fstream>

#include "objstore/bucket_layout.h"
#include "tests/objstore/s3rver.h"
#include "tests/temp_dir.h"

namespace deltacast::objstore {
namespace {

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<uint8_t>(seed + i * 31 + (i >> 9)));
  return v;
}

class S3ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test_util::S3rver::Available()) GTEST_SKIP() << test_util::S3rver::kSkipMessage;
    ASSERT_TRUE(server_.Start()) << "s3rver did not start";
    auto c = S3Client::Create({.endpoint = server_.endpoint(),
                               .bucket = "deltacast",
                               .access_key = "S3RVER",
                               .secret_key = "S3RVER"});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
    Status created = client_->CreateBucket();
    ASSERT_TRUE(created.ok()) << created.ToString();
  }
  test_util::TempDir dir_{"s3client"};
  test_util::S3rver server_{dir_.path() / "s3"};
  std::unique_ptr<S3Client> client_;
};

TEST_F(S3ClientTest, PutGetHeadListDelete) {
  const auto a = Bytes(3 << 20, 1), b = Bytes(17, 2);
  ASSERT_TRUE(client_->Put("c/refits/1/chunks/00000000", a).ok());
  ASSERT_TRUE(client_->Put("c/refits/1/chunks/00000001", b).ok());
  ASSERT_TRUE(client_->Put("c/head", {}).ok());
  auto got = client_->Get("c/refits/1/chunks/00000000");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, a);
  auto size = client_->Head("c/refits/1/chunks/00000001");
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(*size, 17u);
  auto empty = client_->Get("c/head");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->empty());
  auto list = client_->List("c/refits/1/");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].key, "c/refits/1/chunks/00000000");
  EXPECT_EQ((*list)[0].size, a.size());
  EXPECT_EQ((*list)[1].key, "c/refits/1/chunks/00000001");
  ASSERT_TRUE(client_->Delete("c/refits/1/chunks/00000000").ok());
  EXPECT_EQ(client_->Get("c/refits/1/chunks/00000000").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(client_->Delete("c/never-written").ok());
}

// Every request counted by kind, a 404 as a GET that found nothing: the bridges'
// per-refit request figures (and a provider's bill) rest on these.
TEST_F(S3ClientTest, RequestsAreCountedByKind) {
  const objstore::RequestCounts before = client_->requests();
  ASSERT_TRUE(client_->Put("n/a", Bytes(10, 1)).ok());
  ASSERT_TRUE(client_->Get("n/a").ok());
  EXPECT_EQ(client_->Get("n/missing").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(client_->Head("n/a").ok());
  ASSERT_TRUE(client_->List("n/").ok());
  ASSERT_TRUE(client_->Delete("n/a").ok());
  const objstore::RequestCounts d = client_->requests() - before;
  EXPECT_EQ(d.put, 1u);
  EXPECT_EQ(d.get, 2u);
  EXPECT_EQ(d.get_missing, 1u);
  EXPECT_EQ(d.head, 1u);
  EXPECT_EQ(d.list, 1u);
  EXPECT_EQ(d.del, 1u);
  EXPECT_EQ(d.Total(), 6u);
  EXPECT_EQ(d.ToString(), "get=2 get_missing=1 put=1 list=1 head=1 delete=1 total=6");
}

TEST_F(S3ClientTest, PutIsIdempotent) {
  const auto a = Bytes(1000, 7);
  ASSERT_TRUE(client_->Put("k", a).ok());
  ASSERT_TRUE(client_->Put("k", a).ok());
  auto got = client_->Get("k");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, a);
}

TEST_F(S3ClientTest, MissingObjectIsNotFound) {
  auto got = client_->Get("no/such/key");
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().ToString();
  EXPECT_NE(got.status().message().find("no/such/key"), std::string::npos);
  EXPECT_EQ(client_->Head("no/such/key").status().code(), StatusCode::kNotFound);
}

TEST_F(S3ClientTest, TruncatedObjectIsCorrupt) {
  const auto a = Bytes(100000, 3);
  ASSERT_TRUE(client_->Put("t/obj", a).ok());
  const auto file = server_.ObjectFile("deltacast", "t/obj");
  ASSERT_TRUE(std::filesystem::exists(file)) << file;
  std::filesystem::resize_file(file, 4096);  // behind the server's back
  auto got = client_->Get("t/obj");
  EXPECT_EQ(got.status().code(), StatusCode::kCorrupt) << got.status().ToString();
}

TEST_F(S3ClientTest, DamagedObjectIsCorrupt) {
  const auto a = Bytes(5000, 4);
  ASSERT_TRUE(client_->Put("t/obj", a).ok());
  const auto file = server_.ObjectFile("deltacast", "t/obj");
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(100);
  f.put('\x5a');
  f.close();
  auto got = client_->Get("t/obj");
  EXPECT_EQ(got.status().code(), StatusCode::kCorrupt) << got.status().ToString();
}

// s3rver writes a new object's body, then its metadata: a GET in between gets the
// body written so far, its length matching, and no hash (the bucket bridge's answers
// and decisions read that way under load, which failed a catch-up in CI). The state
// between the two writes, made behind the server's back, reads as kCorrupt.
TEST_F(S3ClientTest, ObjectBeingWrittenWithoutItsHashIsCorrupt) {
  const auto a = Bytes(5000, 5);
  ASSERT_TRUE(client_->Put("t/obj", a).ok());
  const auto file = server_.ObjectFile("deltacast", "t/obj");
  const auto metadata = file.parent_path() / "obj._S3rver_metadata.json";
  ASSERT_TRUE(std::filesystem::remove(metadata)) << metadata;
  std::filesystem::resize_file(file, 64);  // the body so far
  auto got = client_->Get("t/obj");
  EXPECT_EQ(got.status().code(), StatusCode::kCorrupt) << got.status().ToString();
  EXPECT_NE(got.status().message().find("x-amz-meta-xxh3"), std::string::npos)
      << got.status().ToString();
  ASSERT_TRUE(client_->Put("t/obj", a).ok());  // written whole: read whole
  got = client_->Get("t/obj");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, a);
}

TEST_F(S3ClientTest, ListPagesThroughManyObjects) {
  for (int i = 0; i < 1105; ++i) {
    ASSERT_TRUE(client_->Put(fmt::format("many/{:08}", i), Bytes(8, uint8_t(i))).ok());
  }
  auto list = client_->List("many/");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 1105u);
  for (int i = 0; i < 1105; ++i) {
    EXPECT_EQ((*list)[i].key, fmt::format("many/{:08}", i));
  }
}

TEST_F(S3ClientTest, GetManyInParallel) {
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i) {
    keys.push_back(fmt::format("par/{:08}", i));
    if (i != 13) {
      ASSERT_TRUE(client_->Put(keys.back(), Bytes(65536 + i, uint8_t(i))).ok());
    }
  }
  auto results = client_->GetMany(keys, 8);
  ASSERT_EQ(results.size(), keys.size());
  for (int i = 0; i < 40; ++i) {
    if (i == 13) {
      EXPECT_EQ(results[i].status().code(), StatusCode::kNotFound);
      continue;
    }
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    EXPECT_EQ(*results[i], Bytes(65536 + i, uint8_t(i)));
  }
}

TEST_F(S3ClientTest, UnknownAccessKeyIsRefused) {
  auto c = S3Client::Create({.endpoint = server_.endpoint(),
                             .bucket = "deltacast",
                             .access_key = "NOBODY",
                             .secret_key = "x"});
  ASSERT_TRUE(c.ok());
  Status s = (*c)->Put("k", Bytes(10, 1));
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("InvalidAccessKeyId"), std::string::npos) << s.ToString();
}

TEST_F(S3ClientTest, ServerDownIsUnavailableThenRecovers) {
  ASSERT_TRUE(client_->Put("k", Bytes(10, 1)).ok());
  server_.Stop();
  EXPECT_EQ(client_->Get("k").status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(server_.Start());
  auto got = client_->Get("k");
  ASSERT_TRUE(got.ok()) << got.status().ToString();  // the data folder survived
  EXPECT_EQ(*got, Bytes(10, 1));
}

TEST(S3ClientOptions, BadEndpointIsRefused) {
  EXPECT_EQ(S3Client::Create(
                {.endpoint = "127.0.0.1:1", .bucket = "b", .access_key = "", .secret_key = ""})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      S3Client::Create(
          {.endpoint = "http://127.0.0.1:1", .bucket = "", .access_key = "", .secret_key = ""})
          .status()
          .code(),
      StatusCode::kInvalidArgument);
}

TEST(BucketLayout, KeysAndObjectsRoundTrip) {
  BucketLayout l("cl/", "bucket-eu");
  EXPECT_EQ(l.Chunk(0xab, 7), "cl/bucket-eu/refits/00000000000000ab/chunks/00000007");
  EXPECT_EQ(*BucketLayout::SequenceOf(l.Chunk(0xab, 12345678)), 12345678u);
  EXPECT_FALSE(BucketLayout::SequenceOf("cl/x/chunks/12").ok());
  EXPECT_EQ(l.Request(0xab), "cl/bucket-eu/requests/00000000000000ab");
  EXPECT_EQ(l.Answer(0xab), "cl/bucket-eu/answers/00000000000000ab");
  EXPECT_EQ(*BucketLayout::RequestIdOf(l.Answer(0xfedcba9876543210)), 0xfedcba9876543210u);
  EXPECT_FALSE(BucketLayout::RequestIdOf("cl/x/answers/ab").ok());
  EXPECT_FALSE(BucketLayout::RequestIdOf("cl/x/answers/zz000000000000ab").ok());
  EXPECT_EQ(*ParseHead(EncodeHead(0xdeadbeef)), 0xdeadbeefu);
  EXPECT_EQ(ParseHead("deltacast-objstore 2 head 00000000deadbeef\n").status().code(),
            StatusCode::kCorrupt);
  Seal seal{42, {{0, 100, 0x1234}, {1, 7, 0xffffffffffffffff}}};
  auto parsed = ParseSeal(EncodeSeal(seal));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->refit_id, 42u);
  ASSERT_EQ(parsed->chunks.size(), 2u);
  EXPECT_EQ(parsed->chunks[1].hash, 0xffffffffffffffffu);
  // A seal that skips a chunk or lies about its count is refused.
  EXPECT_FALSE(ParseSeal("deltacast-objstore 1 sealed 000000000000002a 2\n0 1 0\n2 1 0\n").ok());
  EXPECT_FALSE(ParseSeal("deltacast-objstore 1 sealed 000000000000002a 3\n0 1 0\n1 1 0\n").ok());
  KeptRefit k{Hash128(AsBytes("a")), Hash128(AsBytes("b")), 4096, 9, 77};
  auto chain = ParseChain(EncodeChain({k, k}));
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  ASSERT_EQ(chain->size(), 2u);
  EXPECT_EQ((*chain)[1].target, k.target);
  EXPECT_EQ((*chain)[1].refit_id, 77u);
  EXPECT_FALSE(ParseChain("deltacast-objstore 1 chain\nzz 1 2 3 4\n").ok());
}

}  // namespace
}  // namespace deltacast::objstore
