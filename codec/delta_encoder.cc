#include "codec/delta_encoder.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "codec/change_detect.h"
#include "common/parallel.h"
#include "common/thread_annotations.h"

namespace deltacast::codec {
namespace {

Status CheckSameTable(const Manifest& base, const Manifest& target) {
  if (base.partition_bytes != target.partition_bytes) {
    return Status::InvalidArgument("base and target manifests use different partition sizes");
  }
  if (base.tensors.size() != target.tensors.size()) {
    return Status::InvalidArgument("base has " + std::to_string(base.tensors.size()) +
                                   " tensors, target has " + std::to_string(target.tensors.size()));
  }
  for (size_t t = 0; t < base.tensors.size(); ++t) {
    if (!(base.tensors[t] == target.tensors[t])) {
      return Status::InvalidArgument("tensor '" + target.tensors[t].name +
                                     "' differs in name, dtype or shape between base and target");
    }
    // A record could not carry the name: receivers would refuse every chunk naming it.
    if (target.tensors[t].name.empty() || target.tensors[t].name.size() > kMaxTensorNameBytes) {
      return Status::InvalidArgument(
          "tensor name of " + std::to_string(target.tensors[t].name.size()) +
          " bytes is outside the 1.." + std::to_string(kMaxTensorNameBytes) +
          " bytes a delta can carry");
    }
  }
  return Status::Ok();
}

// One changed partition's record (nullopt: its bytes did not differ after all), and
// whether its changes take the base manifest's hash to the target manifest's.
struct Encoded {
  Status read;  // not OK: the partition's bytes could not be read
  std::optional<EncodedPartition> record;
  bool leads_to_target = true;
};

// Room for one version's bytes of a partition, for readers that copy. Left
// uninitialised: readers that return views never touch it, so its pages are never
// faulted in (zero-filling 2 x 4 MiB per thread cost more than a tenth of a small
// diff's encode).
class ReadBuffer {
 public:
  void Reserve(uint64_t bytes) {
    if (bytes <= size_) return;
    bytes_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
    size_ = bytes;
  }
  std::byte* data() const { return bytes_.get(); }
  MutableByteSpan span() const { return {bytes_.get(), size_}; }

 private:
  std::unique_ptr<std::byte[]> bytes_;
  uint64_t size_ = 0;
};

// One encoder thread's buffers: the codec's, and the two versions' bytes of the
// partition at hand when the readers copy them.
struct WorkerScratch {
  CodecScratch codec;
  ReadBuffer tile_base, tile_target;  // one tile of each version
  ReadBuffer base, target;            // whole partitions, when they must be read whole
};

// Copied partitions are read and compared this much at a time: both versions' tiles
// stay in L2 between the copy and the compare, and the next copy lands in the same
// cache lines. A multiple of every element size.
constexpr uint64_t kReadTileBytes = uint64_t{128} << 10;

// Encoded results handed from workers to the ordered emitter, at most `window` ahead.
class OrderedResults {
 public:
  explicit OrderedResults(size_t window) : slots_(window) {}

  // Blocks until slot `index` is within the window; false once cancelled.
  bool WaitForRoom(size_t index) {
    MutexLock lock(mu_);
    room_.wait(lock, [&]() REQUIRES(mu_) { return cancelled_ || index < next_ + slots_.size(); });
    return !cancelled_;
  }
  void Put(size_t index, Encoded result) {
    MutexLock lock(mu_);
    slots_[index % slots_.size()] = Slot{true, std::move(result)};
    ready_.notify_all();
  }
  // Blocks until the next result in order is ready and takes it.
  Encoded TakeNext() {
    MutexLock lock(mu_);
    Slot& slot = slots_[next_ % slots_.size()];
    ready_.wait(lock, [&]() REQUIRES(mu_) { return slot.filled; });
    Encoded out = std::move(slot.result);
    slot = Slot{};
    ++next_;
    room_.notify_all();
    return out;
  }
  void Cancel() {
    MutexLock lock(mu_);
    cancelled_ = true;
    room_.notify_all();
  }

 private:
  struct Slot {
    bool filled = false;
    Encoded result;
  };
  Mutex mu_;
  CondVar room_, ready_;
  std::vector<Slot> slots_ GUARDED_BY(mu_);
  size_t next_ GUARDED_BY(mu_) = 0;
  bool cancelled_ GUARDED_BY(mu_) = false;
};

}  // namespace

Status EncodeDelta(const Manifest& base, const Manifest& target,
                   const std::function<ByteSpan(size_t)>& base_data,
                   const std::function<ByteSpan(size_t)>& target_data,
                   const Digest128& target_layout, const DeltaEncoderOptions& options,
                   const ChunkSink& sink, DeltaStats* stats) {
  return EncodeDelta(base, target, ReadFromSpans(base_data), ReadFromSpans(target_data),
                     target_layout, options, sink, stats);
}

Status EncodeDelta(const Manifest& base, const Manifest& target, const RangeReader& read_base,
                   const RangeReader& read_target, const Digest128& target_layout,
                   const DeltaEncoderOptions& options, const ChunkSink& sink, DeltaStats* stats) {
  RETURN_IF_ERROR(CheckSameTable(base, target));
  const auto start = std::chrono::steady_clock::now();
  const uint64_t partition_bytes = target.partition_bytes;
  const DeltaIdentity identity{base.VersionId(), target.VersionId(), partition_bytes};

  DeltaStats local;
  DeltaStats& s = stats ? *stats : local;
  s = DeltaStats{};
  s.tensor_bytes = target.TotalBytes();
  s.partitions = target.PartitionTotal();
  for (const auto& t : target.tensors) s.total_elements += t.ElementCount();

  std::vector<PartitionRef> changed;
  for (const PartitionRef& p : PartitionTensors(target.tensors, partition_bytes)) {
    const uint64_t index =
        p.element_offset / PartitionElements(target.tensors[p.tensor].dtype, partition_bytes);
    if (base.partition_hashes[p.tensor][index] != target.partition_hashes[p.tensor][index]) {
      changed.push_back(p);
    }
  }

  uint64_t progress_total = 0, progress_done = 0;
  if (options.on_progress) {
    for (const PartitionRef& p : changed) {
      progress_total += p.element_count * ElementSize(target.tensors[p.tensor].dtype);
    }
    options.on_progress(0, progress_total);
  }

  auto encode_one = [&](size_t i, WorkerScratch& buffers) {
    const PartitionRef& p = changed[i];
    const TensorSpec& info = target.tensors[p.tensor];
    const uint64_t e = ElementSize(info.dtype);
    const uint64_t offset = p.element_offset * e, length = p.element_count * e;
    CodecScratch& scratch = buffers.codec;
    auto failed = [&](const Result<ByteSpan>& a, const Result<ByteSpan>& b) {
      const Status status = !a.ok() ? a.status() : b.status();
      return Encoded{status.WithContext(std::string("reading tensor '") + info.name + "' of the " +
                                        (!a.ok() ? "base" : "target")),
                     std::nullopt, false};
    };
    // The first tile says whether the readers copy. Copied bytes are compared one
    // tile at a time in two small buffers that stay in L2 (copying a partition into
    // 2 x 4 MiB buffers sent every byte out to memory and back); only the changes
    // are kept, and the whole partition is read again only for the rare changes that
    // need more than sparse-XOR. Viewed bytes are compared as they lie, in one piece.
    const uint64_t first = std::min(kReadTileBytes, length);
    buffers.tile_base.Reserve(first);
    buffers.tile_target.Reserve(first);
    Result<ByteSpan> a = read_base(p.tensor, offset, first, buffers.tile_base.span());
    Result<ByteSpan> b = a.ok() ? read_target(p.tensor, offset, first, buffers.tile_target.span())
                                : Result<ByteSpan>(Status::Internal("not read"));
    if (!a.ok() || !b.ok()) return failed(a, b);
    const bool copies =
        a->data() == buffers.tile_base.data() && b->data() == buffers.tile_target.data();
    auto read_whole = [&] {
      buffers.base.Reserve(length);
      buffers.target.Reserve(length);
      a = read_base(p.tensor, offset, length, buffers.base.span());
      b = a.ok() ? read_target(p.tensor, offset, length, buffers.target.span())
                 : Result<ByteSpan>(Status::Internal("not read"));
      return a.ok() && b.ok();
    };
    std::optional<EncodedPartition> record;
    if (!copies || first == length) {
      if (first != length && !read_whole()) return failed(a, b);
      record = EncodePartition(info.dtype, *a, *b, options.codec, scratch);
    } else {
      SparseChanges& changes = scratch.changes;
      changes.clear();
      changes.element_size = static_cast<uint32_t>(e);
      for (uint64_t at = 0; at < length; at += kReadTileBytes) {
        const uint64_t n = std::min(kReadTileBytes, length - at);  // whole elements
        if (at > 0) {
          a = read_base(p.tensor, offset + at, n, buffers.tile_base.span());
          b = a.ok() ? read_target(p.tensor, offset + at, n, buffers.tile_target.span())
                     : Result<ByteSpan>(Status::Internal("not read"));
          if (!a.ok() || !b.ok()) return failed(a, b);
        }
        FindChangesAppend(*a, *b, static_cast<uint32_t>(e), static_cast<uint32_t>(at / e), changes);
      }
      if (!FoundChangesNeedBytes(info.dtype, p.element_count, changes, options.codec)) {
        record = EncodeFoundSparse(info.dtype, options.codec, scratch);
      } else {
        // Compared again whole: the record and its check below must come from the
        // same bytes, even if the files changed since the tiles were read.
        if (!read_whole()) return failed(a, b);
        record = EncodePartition(info.dtype, *a, *b, options.codec, scratch);
      }
    }
    Encoded out{Status::Ok(), std::move(record)};
    if (out.record) {
      // The manifests name the versions the records claim to connect; the bytes read
      // must agree, or receivers would be sent to a version nobody has (a stale
      // manifest, or a checkpoint changed since it was hashed). O(changes): linear
      // hash, H(base ^ mask) = H(base) ^ H(mask).
      const uint64_t index = p.element_offset / PartitionElements(info.dtype, partition_bytes);
      const PartitionHash mask = HashSparseMask(
          scratch.changes.positions, scratch.changes.xors.data(), static_cast<uint32_t>(e));
      out.leads_to_target = (base.partition_hashes[p.tensor][index] ^ mask) ==
                            target.partition_hashes[p.tensor][index];
    }
    return out;
  };
  const size_t threads = options.on_calling_thread ? 0
                         : options.threads         ? options.threads
                                                   : DefaultThreadCount();
  OrderedResults results(4 * std::max<size_t>(threads, 1));
  std::atomic<size_t> next{0};
  auto encode = [&] {
    WorkerScratch scratch;
    for (size_t i = next++; i < changed.size(); i = next++) {
      if (!results.WaitForRoom(i)) return;
      results.Put(i, encode_one(i, scratch));
    }
  };
  std::vector<std::jthread> workers;
  for (size_t t = 0; t < threads; ++t) workers.emplace_back(encode);
  WorkerScratch own_scratch;  // on_calling_thread
  // Destroyed before `workers` (which join): a sink that throws must not leave them
  // waiting for room forever.
  struct CancelOnExit {
    OrderedResults& results;
    ~CancelOnExit() { results.Cancel(); }
  } cancel_on_exit{results};

  Status status;
  uint32_t sequence = 0;
  std::optional<ChunkBuilder> builder;
  std::vector<std::byte> spare;  // a chunk the sink gave back, for the next one
  auto flush = [&]() -> Status {
    if (!builder || builder->record_count() == 0) return Status::Ok();
    std::vector<std::byte> chunk = builder->Finish();
    s.delta_bytes += chunk.size() - options.chunk_headroom;
    ++s.chunks;
    ++sequence;
    builder.reset();
    Status sunk = sink(std::move(chunk));
    if (chunk.capacity() > spare.capacity()) spare = std::move(chunk);  // not kept by the sink
    return sunk;
  };
  for (size_t i = 0; i < changed.size() && status.ok(); ++i) {
    Encoded result = options.on_calling_thread ? encode_one(i, own_scratch) : results.TakeNext();
    std::optional<EncodedPartition>& encoded = result.record;
    const PartitionRef& p = changed[i];
    const TensorSpec& info = target.tensors[p.tensor];
    const uint64_t index = p.element_offset / PartitionElements(info.dtype, partition_bytes);
    if (!result.read.ok()) {
      status = result.read;
      break;
    }
    if (!encoded) {
      // Hashes differ but the bytes do not: the data changed while being read.
      status = Status::FailedPrecondition("tensor '" + info.name +
                                          "' changed while the delta was being encoded");
      break;
    }
    if (!result.leads_to_target) {
      status = Status::FailedPrecondition(
          "tensor '" + info.name + "' partition " + std::to_string(index) +
          ": the bytes compared do not lead from the base manifest's hash to the target "
          "manifest's (a manifest that is not of these checkpoints, or a checkpoint changed "
          "since it was hashed); the delta would reach neither version");
      break;
    }
    if (!builder) {
      // Room for the chunk and the record that takes it past chunk_bytes: grown by
      // doubling instead, a chunk was copied and faulted in again some ten times.
      const size_t room = options.chunk_bytes + std::min(options.chunk_bytes, partition_bytes) +
                          options.chunk_tailroom;
      builder.emplace(identity, sequence, options.chunk_headroom);
      builder->Recycle(options.chunk_buffer ? options.chunk_buffer(options.chunk_headroom + room)
                                            : std::move(spare));
      builder->Reserve(room);
    }
    builder->Add(info.name, info.dtype, p.element_offset, p.element_count,
                 base.partition_hashes[p.tensor][index], target.partition_hashes[p.tensor][index],
                 *encoded);
    ++s.changed_partitions;
    s.changed_elements += encoded->change_count;
    s.records_by_encoding[static_cast<size_t>(encoded->encoding)]++;
    s.payload_bytes_by_encoding[static_cast<size_t>(encoded->encoding)] += encoded->payload.size();
    if (builder->size_bytes() >= options.chunk_bytes) status = flush();
    if (options.on_progress) {
      progress_done += p.element_count * ElementSize(info.dtype);
      options.on_progress(progress_done, progress_total);
    }
  }
  if (!status.ok()) results.Cancel();
  workers.clear();  // joins
  if (status.ok()) status = flush();
  if (status.ok()) {
    DeltaSummary summary{target_layout, sequence, s.changed_partitions, s.tensor_bytes,
                         s.changed_elements};
    std::vector<std::byte> end = BuildEndChunk(identity, sequence, summary);
    s.delta_bytes += end.size();
    if (options.chunk_headroom > 0) {  // a few dozen bytes: copied, unlike the data chunks
      end.insert(end.begin(), options.chunk_headroom, std::byte{0});
    }
    ++s.chunks;
    status = sink(std::move(end));
  }
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return status;
}

}  // namespace deltacast::codec
