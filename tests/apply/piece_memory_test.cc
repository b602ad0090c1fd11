// A PieceMemory on its own: malformed batches and misaligned or foreign buffers are
// refused before any work, reads and hashes see the patches queued before them, rows
// copy as one 2-D copy would, and segments far larger than one block's work hash and
// patch to the host's bits. Built twice, like planned_store_test.cc: over host memory
// (deltacast_apply_tests) and over CUDA device 0 (deltacast_gpu_tests, label `gpu`,
// skipped without a device), where it also checks that the caller's current device is
// restored and that AwaitStream orders the memory after a caller's stream.
#include "apply/device/piece_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "common/partition_hash.h"

#if DELTACAST_TEST_CUDA
#include <cuda_runtime.h>
#endif

namespace deltacast::apply::device {
namespace {

constexpr std::string_view kMemory = DELTACAST_TEST_MEMORY;  // "host" or "cuda"

class PieceMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kMemory == "host") {
      memory_ = NewHostPieceMemory();
      return;
    }
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device here";
    auto memory = NewCudaPieceMemory(0);
    ASSERT_TRUE(memory.ok()) << memory.status().ToString();
    memory_ = std::move(*memory);
  }

  // A buffer of `bytes` random bytes in the memory, and its host copy in `host`.
  std::byte* Filled(size_t bytes, std::vector<std::byte>& host, uint64_t seed) {
    std::mt19937_64 rng(seed);
    host.resize(bytes);
    for (auto& b : host) b = std::byte(static_cast<uint8_t>(rng()));
    auto buffer = memory_->Allocate(bytes);
    EXPECT_TRUE(buffer.ok()) << buffer.status().ToString();
    EXPECT_TRUE(memory_->Write(*buffer, host).ok());
    return *buffer;
  }

  std::vector<std::byte> ReadBack(const std::byte* p, size_t bytes) {
    std::vector<std::byte> out(bytes);
    EXPECT_TRUE(memory_->Read(p, out).ok());
    return out;
  }

  std::unique_ptr<PieceMemory> memory_;
};

PatchSegment Sparse(std::byte* buffer, uint64_t elements, uint32_t element_size) {
  PatchSegment s;
  s.run = {reinterpret_cast<unsigned char*>(buffer), 0, 0, elements, 1, 0, 0};
  s.kind = kSparseXor;
  s.element_size = element_size;
  return s;
}

// Each malformed batch is refused as kCorrupt, naming the segment, and writes nothing,
// even where the other segments of the batch are fine.
TEST_F(PieceMemoryTest, MalformedBatchesAreRefusedBeforeAnyWrite) {
  std::vector<std::byte> host;
  std::byte* buffer = Filled(1024, host, 1);
  auto good = [&] {
    PatchBatch b;
    PatchSegment s = Sparse(buffer, 128, 8);
    s.count = 2;
    b.positions = {3, 5};
    b.words.assign(16, std::byte{0xff});
    b.segments.push_back(s);
    return b;
  };
  struct Case {
    const char* what;
    std::function<void(PatchBatch&)> spoil;
  };
  const std::vector<Case> cases = {
      {"entries past the positions", [](PatchBatch& b) { b.segments[0].count = 3; }},
      {"words past the payload", [](PatchBatch& b) { b.segments[0].word_offset = 9; }},
      {"an element size of 3", [](PatchBatch& b) { b.segments[0].element_size = 3; }},
      {"an unknown kind", [](PatchBatch& b) { b.segments[0].kind = 7; }},
      {"no buffer", [](PatchBatch& b) { b.segments[0].run.base = nullptr; }},
      {"a dense segment past its bytes",
       [&](PatchBatch& b) {
         PatchSegment d = Sparse(buffer, 16, 8);
         d.kind = kDenseXor;
         b.dense.assign(120, std::byte{1});  // 128 needed
         b.segments.push_back(d);
       }},
      {"rows that overlap in the partition",
       [&](PatchBatch& b) {
         PatchSegment d = Sparse(buffer, 8, 8);
         d.kind = kLiteral;
         d.run.rows = 2;
         d.run.dst_stride = 4;
         d.run.src_stride = 8;
         b.dense.assign(1024, std::byte{1});
         b.segments.push_back(d);
       }},
      {"an extent that overflows",
       [&](PatchBatch& b) {
         PatchSegment d = Sparse(buffer, 8, 8);
         d.kind = kDenseXor;
         d.run.rows = uint64_t{1} << 62;
         d.run.dst_stride = 8;
         d.run.src_stride = 8;
         b.segments.push_back(d);
       }},
  };
  for (const Case& c : cases) {
    PatchBatch batch = good();
    c.spoil(batch);
    const Status s = memory_->Patch(batch);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << c.what << ": " << s.ToString();
    EXPECT_NE(s.message().find("patch segment"), std::string::npos) << s.ToString();
    ASSERT_TRUE(memory_->Sync().ok()) << c.what;
    EXPECT_EQ(ReadBack(buffer, host.size()), host) << c.what << " wrote";
  }
  const PatchBatch batch = good();
  ASSERT_TRUE(memory_->Patch(batch).ok());
  ASSERT_TRUE(memory_->Sync().ok());
  EXPECT_NE(ReadBack(buffer, host.size()), host);
}

TEST_F(PieceMemoryTest, MisalignedBuffersAreRefused) {
  std::vector<std::byte> host;
  std::byte* buffer = Filled(4096, host, 2);
  EXPECT_TRUE(memory_->CheckRegion(buffer, 4096, 8).ok());
  const Status misaligned = memory_->CheckRegion(buffer + 2, 64, 8);
  EXPECT_EQ(misaligned.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(misaligned.message().find("aligned"), std::string::npos) << misaligned.ToString();
  EXPECT_EQ(memory_->CheckRegion(nullptr, 8, 1).code(), StatusCode::kInvalidArgument);
  ChangeList changes;
  const Status find = memory_->FindChanges(buffer + 4, buffer + 2048, 100, 8, changes);
  EXPECT_EQ(find.code(), StatusCode::kInvalidArgument) << find.ToString();
  EXPECT_EQ(memory_->FindChanges(buffer, buffer + 2048, 100, 3, changes).code(),
            StatusCode::kInvalidArgument);
}

// What a read, a hash or a write does after a patch that was queued and not synced:
// it comes after the patch (on a GPU, the same stream), never before.
TEST_F(PieceMemoryTest, ReadsAndHashesSeeThePatchesQueuedBeforeThem) {
  constexpr size_t kBytes = size_t{8} << 20;
  std::vector<std::byte> host;
  std::byte* buffer = Filled(kBytes, host, 3);
  PatchBatch batch;
  PatchSegment s = Sparse(buffer, kBytes / 8, 8);
  s.kind = kDenseXor;
  batch.segments.push_back(s);
  batch.dense.resize(kBytes);
  std::mt19937_64 rng(4);
  for (auto& b : batch.dense) b = std::byte(static_cast<uint8_t>(rng()));
  std::vector<std::byte> want = host;
  for (size_t i = 0; i < kBytes; ++i) want[i] ^= batch.dense[i];

  ASSERT_TRUE(memory_->Patch(batch).ok());
  HashSegment h{s.run, 8, 0};
  PartitionHash got;
  ASSERT_TRUE(memory_->Hash({&h, 1}, {&got, 1}).ok());
  EXPECT_EQ(got, HashStridedRun(want.data(), StridedRun{1, kBytes, 0, 0, 0}));
  ASSERT_TRUE(memory_->Patch(batch).ok());  // back to `host`
  EXPECT_EQ(ReadBack(buffer, kBytes), host);
  ASSERT_TRUE(memory_->Patch(batch).ok());
  ASSERT_TRUE(memory_->Write(buffer, ByteSpan(host.data(), 4096)).ok());  // after it
  ASSERT_TRUE(memory_->Sync().ok());
  std::vector<std::byte> after = ReadBack(buffer, kBytes);
  EXPECT_TRUE(std::equal(after.begin(), after.begin() + 4096, host.begin()));
  EXPECT_TRUE(std::equal(after.begin() + 4096, after.end(), want.begin() + 4096));
}

TEST_F(PieceMemoryTest, RowsCopyAsARowLoopWould) {
  std::vector<std::byte> host;
  std::byte* buffer = Filled(64 * 100, host, 5);
  std::vector<std::byte> rows(24 * 10);
  ASSERT_TRUE(memory_->ReadRows(buffer + 8, 100, rows.data(), 24, 20, 10).ok());
  for (size_t r = 0; r < 10; ++r) {
    EXPECT_TRUE(
        std::equal(rows.begin() + r * 24, rows.begin() + r * 24 + 20, host.begin() + 8 + r * 100))
        << "row " << r;
  }
  std::vector<std::byte> source(30 * 7, std::byte{0x5a});
  ASSERT_TRUE(memory_->WriteRows(source.data(), 30, buffer + 1, 200, 29, 7).ok());
  std::vector<std::byte> want = host;
  for (size_t r = 0; r < 7; ++r) std::fill_n(want.begin() + 1 + r * 200, 29, std::byte{0x5a});
  EXPECT_EQ(ReadBack(buffer, host.size()), want);
}

// Segments whose work spans many blocks (a GPU spreads one segment over the whole
// device) next to tiny ones, in one call: the host's hash bits and patched bytes.
TEST_F(PieceMemoryTest, LargeAndTinySegmentsInOneCallGiveTheHostsBits) {
  constexpr size_t kBytes = size_t{24} << 20;
  std::vector<std::byte> host;
  std::byte* buffer = Filled(kBytes, host, 6);
  auto* base = reinterpret_cast<unsigned char*>(buffer);
  std::vector<HashSegment> segments = {
      {{base, 0, 0, kBytes / 2, 1, 0, 0}, 2, 0},                  // 12 MiB, one row
      {{base, 3, 1000, 333, 4096, 16, 2048}, 1, 1},               // 4096 short rows
      {{base, 5, 0, 1, 1, kBytes - 1, 0}, 1, 2},                  // the last byte alone
      {{base, 0, 3 << 20, 3 << 20, 3, 1 << 20, 7 << 20}, 1, 1}};  // wide rows, slot 1 again
  std::vector<PartitionHash> want(3);
  for (const HashSegment& h : segments) {
    const uint64_t e = h.element_size;
    want[h.slot] ^= HashStridedRun(host.data() + h.run.src * e,
                                   StridedRun{h.run.rows, h.run.len * e, h.run.src_stride * e,
                                              h.run.part_dst * e, h.run.dst_stride * e});
  }
  std::vector<PartitionHash> got(3);
  ASSERT_TRUE(memory_->Hash(segments, got).ok());
  EXPECT_EQ(got, want);

  // One sparse segment of many entries over the first half and one literal segment
  // of many rows over the second (segments of a batch touch disjoint elements).
  PatchBatch batch;
  PatchSegment sparse = Sparse(buffer, kBytes / 8, 4);
  for (uint32_t p = 7; p < kBytes / 8; p += 3) batch.positions.push_back(p);
  sparse.count = batch.positions.size();
  batch.words.assign(sparse.count * 4, std::byte{0x81});
  PatchSegment literal = Sparse(buffer, 100, 1);
  literal.kind = kLiteral;
  literal.run.rows = 2500;
  literal.run.dst_stride = 100;
  literal.run.src = 1;
  literal.run.src_stride = 4097;
  literal.run.base = base + kBytes / 2 + 2;  // rows on no word boundary: the byte path
  batch.dense.resize(100 * 2500);
  for (size_t i = 0; i < batch.dense.size(); ++i) batch.dense[i] = std::byte(i * 7);
  batch.segments = {sparse, literal};
  std::vector<std::byte> want_bytes = host;
  for (uint32_t p : batch.positions) {
    for (int b = 0; b < 4; ++b) want_bytes[p * 4 + b] ^= std::byte{0x81};
  }
  for (size_t r = 0; r < 2500; ++r) {
    std::memcpy(want_bytes.data() + kBytes / 2 + 2 + 1 + r * 4097, batch.dense.data() + r * 100,
                100);
  }
  ASSERT_TRUE(memory_->Patch(batch).ok());
  ASSERT_TRUE(memory_->Sync().ok());
  EXPECT_TRUE(ReadBack(buffer, kBytes) == want_bytes);
}

#if DELTACAST_TEST_CUDA
// Every call leaves the caller on the device it was on (an engine's next allocation
// must not land on the memory's GPU).
TEST_F(PieceMemoryTest, TheCallersDeviceIsRestored) {
  const int count = CudaDeviceCount();
  auto other = NewCudaPieceMemory(count - 1);
  ASSERT_TRUE(other.ok());
  for (int caller = 0; caller < count; ++caller) {
    ASSERT_EQ(cudaSetDevice(caller), cudaSuccess);
    std::vector<std::byte> host;
    std::byte* buffer = Filled(4096, host, 7);
    auto elsewhere = (*other)->Allocate(4096);
    ASSERT_TRUE(elsewhere.ok());
    HashSegment h{{reinterpret_cast<unsigned char*>(buffer), 0, 0, 4096, 1, 0, 0}, 1, 0};
    PartitionHash out;
    ASSERT_TRUE(memory_->Hash({&h, 1}, {&out, 1}).ok());
    ChangeList changes;
    ASSERT_TRUE(memory_->FindChanges(buffer, buffer, 512, 8, changes).ok());
    ASSERT_TRUE(memory_->AwaitStream(0).ok());
    int now = -1;
    ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
    EXPECT_EQ(now, caller);
  }
}

// A buffer written on the caller's own stream is read by the memory only after that
// stream's work: AwaitStream(stream) orders without blocking the host.
TEST_F(PieceMemoryTest, AwaitStreamOrdersAfterTheCallersWrites) {
  constexpr size_t kBytes = size_t{256} << 20;
  std::vector<std::byte> host;
  std::byte* buffer = Filled(kBytes, host, 8);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // The caller writes 0x33 everywhere, several times over (long enough to race).
  for (int i = 0; i < 8; ++i) ASSERT_EQ(cudaMemsetAsync(buffer, 0x33, kBytes, stream), cudaSuccess);
  ASSERT_TRUE(memory_->AwaitStream(reinterpret_cast<uintptr_t>(stream)).ok());
  HashSegment h{{reinterpret_cast<unsigned char*>(buffer), 0, 0, kBytes, 1, 0, 0}, 1, 0};
  PartitionHash got;
  ASSERT_TRUE(memory_->Hash({&h, 1}, {&got, 1}).ok());
  const std::vector<std::byte> want(kBytes, std::byte{0x33});
  EXPECT_EQ(got, HashStridedRun(want.data(), StridedRun{1, kBytes, 0, 0, 0}));
  cudaStreamDestroy(stream);
}

TEST_F(PieceMemoryTest, HostMemoryIsNotDeviceMemory) {
  std::vector<std::byte> host(4096);
  const Status s = memory_->CheckRegion(host.data(), host.size(), 8);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}
#endif

}  // namespace
}  // namespace deltacast::apply::device
