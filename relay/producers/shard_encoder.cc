#include "relay/producers/shard_encoder.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>

#include "codec/change_detect.h"
#include "codec/chunk.h"
#include "codec/partition.h"
#include "common/parallel.h"
#include "layout/values.h"

namespace deltacast::relay {
namespace {

using layout::Run;
using layout::Value;

// A canonical partition the share touches and the clipped runs that put bytes in it.
struct Unit {
  PartitionShare share;
  uint64_t begin = 0;  // first canonical element
  std::vector<Run> pieces;
};

std::vector<Unit> Units(const layout::PlacementMap& map, uint64_t partition_bytes) {
  std::vector<Unit> out;
  for (uint32_t c : map.CoveredCanonical()) {
    const TensorSpec& t = map.canonical()[c];
    const uint64_t n = t.ElementCount(), per = codec::PartitionElements(t.dtype, partition_bytes);
    for (uint64_t k = 0; k * per < n; ++k) {
      Unit u;
      u.begin = k * per;
      const uint64_t end = std::min(n, u.begin + per);
      u.pieces = map.ShardPieces(c, u.begin, end);
      if (u.pieces.empty()) continue;
      u.share = {c, k, 0, end - u.begin};
      for (const Run& r : u.pieces) u.share.covered += r.Elements();
      out.push_back(std::move(u));
    }
  }
  return out;
}

size_t Threads(size_t threads, size_t items) {
  return std::max<size_t>(1, std::min(threads ? threads : DefaultThreadCount(), items));
}

struct Scratch {
  codec::CodecScratch codec;
  codec::SparseChanges row;
  codec::SparseChanges acc;
  std::vector<std::byte> new_words;
  std::vector<std::byte> old_canon, new_canon;
  std::vector<std::byte> gather_old, gather_new;
};

// What one worker thread produced.
struct Output {
  std::vector<std::vector<std::byte>> chunks;
  std::vector<SharePiece> pieces;
  std::vector<ShareChange> changes;
  ShareStats stats;
};

// A device share's changes, per local tensor (empty for locals without runs).
using LocalChanges = std::vector<apply::device::ChangeList>;

class Encoder {
 public:
  Encoder(const ShareInput& in, const ShareEncodeOptions& o, const LocalChanges* device)
      : in_(in), o_(o), device_(device) {}

  // Encodes unit `u` and sets `base_piece` to the share's base contribution to its
  // partition's hash, computed in the compare pass (for a device share's plain runs,
  // the caller adds the device's hash of them).
  void Encode(const Unit& u, const PartitionHash& base_hash, Scratch& s, Output& out,
              std::optional<codec::ChunkBuilder>& builder, PartitionHash& base_piece) {
    base_piece = {};
    const TensorSpec& t = in_.map->canonical()[u.share.tensor];
    const uint32_t e = static_cast<uint32_t>(ElementSize(t.dtype));
    bool residual = false;
    for (const Run& r : u.pieces) residual |= r.value != Value::kBits;
    for (const Run& r : u.pieces) out.stats.local_bytes += r.Elements() * LocalSize(r);

    if (device_ == nullptr && u.share.Whole() && u.pieces.size() == 1 && u.pieces[0].count == 1 &&
        !residual) {
      // One contiguous run: the partition's bytes lie as they are, so every
      // encoding is open to it, as in EncodeDelta.
      const Run& r = u.pieces[0];
      const ByteSpan a = in_.base(r.local).subspan(r.src * e, r.len * e);
      const ByteSpan b = in_.target(r.local).subspan(r.src * e, r.len * e);
      auto encoded = codec::EncodePartition(t.dtype, a, b, o_.codec, s.codec, &base_piece);
      if (!encoded) return;
      const PartitionHash mask =
          HashSparseMask(s.codec.changes.positions, s.codec.changes.xors.data(), e);
      AddRecord(u, t, base_hash, mask, *encoded, out, builder);
      return;
    }

    base_piece = Collect(u, t, e, residual, s);
    if (s.acc.size() == 0) return;
    const PartitionHash mask = HashSparseMask(s.acc.positions, s.acc.xors.data(), e);
    const codec::Encoding kind =
        residual ? codec::Encoding::kOverwrite : codec::Encoding::kSparseXor;
    if (!u.share.Whole()) {
      SharePiece piece{
          u.share.tensor, u.share.partition, mask,
          codec::EncodeChanges(kind, t.dtype, s.acc, s.new_words.data(), o_.codec, s.codec)};
      out.stats.piece_bytes += piece.encoded.payload.size();
      out.stats.changed_elements += s.acc.size();
      out.changes.push_back({u.share.tensor, u.share.partition, mask, false});
      out.pieces.push_back(std::move(piece));
      return;
    }
    const bool dense = s.acc.size() * 4 > u.share.length;
    if (!residual && device_ == nullptr &&
        (dense || o_.codec.mode == codec::CodecMode::kContext || o_.codec.try_every_encoding)) {
      // Worth the copy: gathered, the partition can take dense, literal or context
      // encodings, which a list of changes cannot.
      Gather(u, e, s);
      auto encoded = codec::EncodePartition(t.dtype, s.gather_old, s.gather_new, o_.codec, s.codec);
      if (encoded) AddRecord(u, t, base_hash, mask, *encoded, out, builder);
      return;
    }
    AddRecord(u, t, base_hash, mask,
              codec::EncodeChanges(kind, t.dtype, s.acc, s.new_words.data(), o_.codec, s.codec),
              out, builder);
  }

 private:
  uint64_t LocalSize(const Run& r) const {
    return ElementSize(in_.map->locals()[r.local].spec.dtype);
  }

  void AddRecord(const Unit& u, const TensorSpec& t, const PartitionHash& base_hash,
                 const PartitionHash& mask, const codec::EncodedPartition& encoded, Output& out,
                 std::optional<codec::ChunkBuilder>& builder) {
    if (!builder) {
      builder.emplace(codec::DeltaIdentity{{}, {}, o_.partition_bytes}, 0);
      builder->Reserve(o_.chunk_bytes + (o_.chunk_bytes >> 2));
    }
    builder->Add(t.name, t.dtype, u.begin, u.share.length, base_hash, base_hash ^ mask, encoded);
    out.stats.records++;
    out.stats.changed_elements += encoded.change_count;
    out.changes.push_back({u.share.tensor, u.share.partition, mask, true});
    if (builder->size_bytes() >= o_.chunk_bytes) Flush(out, builder);
  }

 public:
  static void Flush(Output& out, std::optional<codec::ChunkBuilder>& builder) {
    if (!builder || builder->record_count() == 0) return;
    out.chunks.push_back(builder->Finish());
    out.stats.chunk_bytes += out.chunks.back().size();
    builder.reset();
  }

 private:
  // The changes of every run row in the partition, as partition positions, XOR
  // words and (residual) new words; returns the base contribution of the rows it
  // compared on the host (canonical values for residual rows).
  PartitionHash Collect(const Unit& u, const TensorSpec& t, uint32_t e, bool residual, Scratch& s) {
    PartitionHash base_piece;
    s.acc.clear();
    s.acc.element_size = e;
    s.new_words.clear();
    bool sorted = true;
    for (const Run& r : u.pieces) {
      if (device_ != nullptr && !residual) {
        CollectFound(u, r, e, s, sorted);
        continue;
      }
      if (!residual && r.count > 1 && r.src_stride == r.len) {
        base_piece ^= CollectPackedRows(u, r, e, s, sorted);
        continue;
      }
      const TensorSpec& local = in_.map->locals()[r.local].spec;
      const uint64_t le = ElementSize(local.dtype);
      const std::byte* a = in_.base(r.local).data();
      const std::byte* b = in_.target(r.local).data();
      for (uint64_t i = 0; i < r.count; ++i) {
        const uint64_t src = r.src + i * r.src_stride;
        const uint64_t dst = r.dst + i * r.dst_stride - u.begin;
        const std::byte* old_row = a + src * le;
        const std::byte* new_row = b + src * le;
        if (r.value != Value::kBits) {
          s.old_canon.resize(r.len * e);
          s.new_canon.resize(r.len * e);
          layout::TransformValues(r.value, local.dtype, old_row, t.dtype, s.old_canon.data(),
                                  r.len);
          layout::TransformValues(r.value, local.dtype, new_row, t.dtype, s.new_canon.data(),
                                  r.len);
          old_row = s.old_canon.data();
          new_row = s.new_canon.data();
        }
        base_piece ^= codec::FindChangesHashingBase(
            ByteSpan(old_row, r.len * e), ByteSpan(new_row, r.len * e), e, dst * e, s.row);
        if (s.row.size() == 0) continue;
        if (!s.acc.positions.empty() && dst + s.row.positions.front() <= s.acc.positions.back()) {
          sorted = false;
        }
        for (uint32_t p : s.row.positions)
          s.acc.positions.push_back(static_cast<uint32_t>(dst + p));
        s.acc.xors.insert(s.acc.xors.end(), s.row.xors.begin(), s.row.xors.end());
        if (residual) {
          for (uint32_t p : s.row.positions) {
            s.new_words.insert(s.new_words.end(), new_row + size_t{p} * e,
                               new_row + size_t{p} * e + e);
          }
        }
      }
    }
    if (!sorted) SortChanges(s, residual);
    return base_piece;
  }

  // Collect for a bit run whose rows lie packed in the local tensor (src_stride ==
  // len: an FP8 image's runs, a column-parallel shard's slice), on the host. One
  // compare per tile of whole rows (~64 KiB, in cache for the hash) instead of one
  // compare and one hash call per row, which cost more than the bytes for short rows;
  // the changes' local positions are mapped to the partition's. The same changes,
  // in the same order, and the same base contribution as row by row.
  PartitionHash CollectPackedRows(const Unit& u, const Run& r, uint32_t e, Scratch& s,
                                  bool& sorted) const {
    constexpr uint64_t kTileBytes = uint64_t{64} << 10;
    const uint64_t row_bytes = r.len * e;
    const uint64_t tile_rows = std::max<uint64_t>(1, kTileBytes / row_bytes);
    const std::byte* a = in_.base(r.local).data() + r.src * e;
    const std::byte* b = in_.target(r.local).data() + r.src * e;
    PartitionHash sum;
    for (uint64_t i0 = 0; i0 < r.count; i0 += tile_rows) {
      const uint64_t rows = std::min(tile_rows, r.count - i0);
      const std::byte* old_tile = a + i0 * row_bytes;
      const uint64_t dst = r.dst + i0 * r.dst_stride - u.begin;  // the tile's first element
      codec::FindChanges(ByteSpan(old_tile, rows * row_bytes),
                         ByteSpan(b + i0 * row_bytes, rows * row_bytes), e, s.row);
      sum ^= HashStridedRun(old_tile,
                            StridedRun{rows, row_bytes, row_bytes, dst * e, r.dst_stride * e});
      if (s.row.size() == 0) continue;
      const auto at = [&](uint32_t p) {
        const uint64_t row = p / r.len;
        return static_cast<uint32_t>(dst + row * r.dst_stride + (p - row * r.len));
      };
      if (!s.acc.positions.empty() && at(s.row.positions.front()) <= s.acc.positions.back()) {
        sorted = false;
      }
      for (uint32_t p : s.row.positions) s.acc.positions.push_back(at(p));
      s.acc.xors.insert(s.acc.xors.end(), s.row.xors.begin(), s.row.xors.end());
    }
    return sum;
  }

  // Collect for a run of a device share: each row's changes from its local tensor's
  // list (found on the GPU), by binary search for the row's first element.
  void CollectFound(const Unit& u, const Run& r, uint32_t e, Scratch& s, bool& sorted) const {
    const apply::device::ChangeList& found = (*device_)[r.local];
    for (uint64_t i = 0; i < r.count; ++i) {
      const uint64_t src = r.src + i * r.src_stride;
      const uint64_t dst = r.dst + i * r.dst_stride - u.begin;
      auto it = std::lower_bound(found.positions.begin(), found.positions.end(), src);
      if (it == found.positions.end() || *it >= src + r.len) continue;
      if (!s.acc.positions.empty() && dst + (*it - src) <= s.acc.positions.back()) {
        sorted = false;
      }
      for (; it != found.positions.end() && *it < src + r.len; ++it) {
        const size_t k = it - found.positions.begin();
        s.acc.positions.push_back(static_cast<uint32_t>(dst + (*it - src)));
        s.acc.xors.insert(s.acc.xors.end(), found.xors.begin() + k * e,
                          found.xors.begin() + (k + 1) * e);
      }
    }
  }

  // Runs that interleave in the partition (rare: two rules into one tensor).
  static void SortChanges(Scratch& s, bool residual) {
    const uint32_t e = s.acc.element_size;
    std::vector<uint32_t> order(s.acc.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](uint32_t x, uint32_t y) { return s.acc.positions[x] < s.acc.positions[y]; });
    codec::SparseChanges sorted;
    sorted.element_size = e;
    std::vector<std::byte> words;
    for (uint32_t k : order) {
      sorted.positions.push_back(s.acc.positions[k]);
      sorted.xors.insert(sorted.xors.end(), s.acc.xors.begin() + size_t{k} * e,
                         s.acc.xors.begin() + size_t{k} * e + e);
      if (residual) {
        words.insert(words.end(), s.new_words.begin() + size_t{k} * e,
                     s.new_words.begin() + size_t{k} * e + e);
      }
    }
    s.acc = std::move(sorted);
    if (residual) s.new_words = std::move(words);
  }

  // The whole partition's bytes at both versions, from its runs (bits only).
  void Gather(const Unit& u, uint32_t e, Scratch& s) {
    s.gather_old.resize(u.share.length * e);
    s.gather_new.resize(u.share.length * e);
    for (const Run& r : u.pieces) {
      const std::byte* a = in_.base(r.local).data();
      const std::byte* b = in_.target(r.local).data();
      for (uint64_t i = 0; i < r.count; ++i) {
        const uint64_t src = (r.src + i * r.src_stride) * e;
        const uint64_t dst = (r.dst + i * r.dst_stride - u.begin) * e;
        std::memcpy(s.gather_old.data() + dst, a + src, r.len * e);
        std::memcpy(s.gather_new.data() + dst, b + src, r.len * e);
      }
    }
  }

  const ShareInput& in_;
  const ShareEncodeOptions& o_;
  const LocalChanges* device_;
};

// Whether local tensor `local` has a run that transforms values (residual).
bool HasResidualRun(const layout::PlacementMap& map, uint32_t local) {
  for (const Run& r : map.RunsOf(local)) {
    if (r.value != Value::kBits) return true;
  }
  return false;
}

// A device share: the addresses of both versions, and host bytes for the locals whose
// values are transformed (they are converted on the host, as they are small: norms).
Status CheckDeviceShare(const ShareInput& in) {
  if (!in.base_address || !in.target_address) {
    return Status::InvalidArgument("a device share needs the addresses of both versions");
  }
  for (uint32_t i = 0; i < in.map->locals().size(); ++i) {
    const TensorSpec& spec = in.map->locals()[i].spec;
    if (HasResidualRun(*in.map, i) && (!in.base || !in.target)) {
      return Status::InvalidArgument("local tensor '" + spec.name +
                                     "' holds a transform of its canonical values: a device "
                                     "share needs its host bytes (ShareInput::base / target)");
    }
    if (in.map->RunsOf(i).empty() || HasResidualRun(*in.map, i)) continue;
    // Both versions must lie in the share's memory, aligned: checked before any launch.
    const uint64_t e = ElementSize(spec.dtype);
    for (const std::byte* at : {in.base_address(i), in.target_address(i)}) {
      RETURN_IF_ERROR(in.memory->CheckRegion(at, spec.ElementCount() * e, static_cast<uint32_t>(e))
                          .WithContext("local tensor '" + spec.name + "'"));
    }
  }
  return Status::Ok();
}

// The changes of each local tensor of a device share whose runs carry bits, found on
// the device.
Result<LocalChanges> FindDeviceChanges(const ShareInput& in) {
  const auto& locals = in.map->locals();
  LocalChanges out(locals.size());
  for (uint32_t i = 0; i < locals.size(); ++i) {
    if (in.map->RunsOf(i).empty() || HasResidualRun(*in.map, i)) continue;
    const TensorSpec& spec = locals[i].spec;
    RETURN_IF_ERROR(in.memory->FindChanges(in.base_address(i), in.target_address(i),
                                           spec.ElementCount(),
                                           static_cast<uint32_t>(ElementSize(spec.dtype)), out[i]));
  }
  return out;
}

// HashShare for a device share's bit runs: one hash call over every unit's runs.
Result<std::vector<PartitionHash>> HashDeviceShare(const ShareInput& input,
                                                   const std::vector<Unit>& units) {
  std::vector<apply::device::HashSegment> segments;
  for (uint32_t k = 0; k < units.size(); ++k) {
    const Unit& u = units[k];
    const uint32_t e =
        static_cast<uint32_t>(ElementSize(input.map->canonical()[u.share.tensor].dtype));
    for (const Run& r : u.pieces) {
      if (r.value != Value::kBits) continue;  // converted and hashed on the host
      apply::device::PlacedRun run;
      run.base =
          reinterpret_cast<unsigned char*>(const_cast<std::byte*>(input.base_address(r.local)));
      run.part_dst = r.dst - u.begin;
      run.dst_stride = r.dst_stride;
      run.len = r.len;
      run.rows = r.count;
      run.src = r.src;
      run.src_stride = r.src_stride;
      segments.push_back({run, e, k});
    }
  }
  std::vector<PartitionHash> out(units.size());
  RETURN_IF_ERROR(input.memory->Hash(segments, out).WithContext("hashing the share"));
  return out;
}

Status CheckSizes(const ShareInput& in) {
  const auto& locals = in.map->locals();
  for (uint32_t i = 0; i < locals.size(); ++i) {
    if (in.map->RunsOf(i).empty()) continue;
    const uint64_t want = locals[i].spec.ByteSize();
    if (in.base(i).size() != want || in.target(i).size() != want) {
      return Status::InvalidArgument(
          "local tensor '" + locals[i].spec.name + "' has " + std::to_string(in.base(i).size()) +
          " / " + std::to_string(in.target(i).size()) +
          " bytes (previous / new), its header says " + std::to_string(want));
    }
  }
  return Status::Ok();
}

}  // namespace

std::vector<PartitionShare> ShareCoverage(const layout::PlacementMap& map,
                                          uint64_t partition_bytes) {
  std::vector<PartitionShare> out;
  for (const Unit& u : Units(map, partition_bytes)) out.push_back(u.share);
  return out;
}

Result<std::vector<PartitionHash>> HashShare(const ShareInput& input,
                                             const std::vector<PartitionShare>& coverage,
                                             uint64_t partition_bytes, size_t threads) {
  const std::vector<Unit> units = Units(*input.map, partition_bytes);
  std::vector<PartitionHash> out(units.size());
  if (input.memory != nullptr) {
    RETURN_IF_ERROR(CheckDeviceShare(input));
    ASSIGN_OR_RETURN(out, HashDeviceShare(input, units));
  }
  ParallelFor(units.size(), Threads(threads, units.size()), [&](size_t k) {
    const Unit& u = units[k];
    const TensorSpec& t = input.map->canonical()[u.share.tensor];
    const uint64_t e = ElementSize(t.dtype);
    thread_local std::vector<std::byte> row;
    PartitionHash sum;
    for (const Run& r : u.pieces) {
      const TensorSpec& local = input.map->locals()[r.local].spec;
      const uint64_t le = ElementSize(local.dtype);
      if (r.value == Value::kBits && input.memory != nullptr) continue;  // hashed there
      const std::byte* a = input.base(r.local).data();
      if (r.value == Value::kBits) {
        sum ^= HashStridedRun(a + r.src * e, StridedRun{r.count, r.len * e, r.src_stride * e,
                                                        (r.dst - u.begin) * e, r.dst_stride * e});
        continue;
      }
      row.resize(r.len * e);
      for (uint64_t i = 0; i < r.count; ++i) {
        layout::TransformValues(r.value, local.dtype, a + (r.src + i * r.src_stride) * le, t.dtype,
                                row.data(), r.len);
        sum ^= HashPiece(row, (r.dst + i * r.dst_stride - u.begin) * e);
      }
    }
    out[k] ^= sum;
  });
  (void)coverage;
  return out;
}

Result<EncodedShare> EncodeShare(const ShareInput& input,
                                 const std::vector<PartitionShare>& coverage,
                                 std::span<const PartitionHash> base_hashes,
                                 const ShareEncodeOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Unit> units = Units(*input.map, options.partition_bytes);
  if (units.size() != coverage.size() || base_hashes.size() != coverage.size()) {
    return Status::InvalidArgument("coverage of " + std::to_string(coverage.size()) +
                                   " partitions with " + std::to_string(base_hashes.size()) +
                                   " base hashes, but the share covers " +
                                   std::to_string(units.size()));
  }
  LocalChanges found;
  std::vector<PartitionHash> device_base;
  if (input.memory != nullptr) {
    RETURN_IF_ERROR(CheckDeviceShare(input));
    for (const Unit& u : units) {
      // Overwrite records need the new words of every change, which a device list
      // of XOR words does not carry.
      const auto bits = std::count_if(u.pieces.begin(), u.pieces.end(),
                                      [](const Run& r) { return r.value == Value::kBits; });
      if (bits != 0 && bits != static_cast<long>(u.pieces.size())) {
        return Status::Unsupported("canonical tensor '" +
                                   input.map->canonical()[u.share.tensor].name +
                                   "' mixes transformed and plain runs in one partition: serve "
                                   "this share from host memory");
      }
    }
    ASSIGN_OR_RETURN(found, FindDeviceChanges(input));
    // The device holds the plain runs' bytes: their base contributions come from its
    // hash, the residual rows' from the host compare below.
    ASSIGN_OR_RETURN(device_base, HashDeviceShare(input, units));
  } else {
    RETURN_IF_ERROR(CheckSizes(input));
  }
  Encoder encoder(input, options, input.memory != nullptr ? &found : nullptr);
  const size_t threads = Threads(options.threads, units.size());
  std::vector<Output> outputs(threads);
  EncodedShare share;
  share.base_pieces.resize(units.size());
  std::atomic<size_t> next{0};
  ParallelFor(threads, threads, [&](size_t t) {
    Scratch scratch;
    std::optional<codec::ChunkBuilder> builder;
    for (size_t k = next++; k < units.size(); k = next++) {
      encoder.Encode(units[k], base_hashes[k], scratch, outputs[t], builder, share.base_pieces[k]);
      if (!device_base.empty()) share.base_pieces[k] ^= device_base[k];
    }
    Encoder::Flush(outputs[t], builder);
  });
  for (Output& o : outputs) {
    for (auto& c : o.chunks) share.chunks.push_back(std::move(c));
    for (auto& p : o.pieces) share.pieces.push_back(std::move(p));
    share.changes.insert(share.changes.end(), o.changes.begin(), o.changes.end());
    share.stats.local_bytes += o.stats.local_bytes;
    share.stats.changed_elements += o.stats.changed_elements;
    share.stats.records += o.stats.records;
    share.stats.chunk_bytes += o.stats.chunk_bytes;
    share.stats.piece_bytes += o.stats.piece_bytes;
  }
  auto order = [](const auto& a, const auto& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.partition < b.partition;
  };
  std::sort(share.pieces.begin(), share.pieces.end(), order);
  std::sort(share.changes.begin(), share.changes.end(), order);
  share.stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return share;
}

}  // namespace deltacast::relay
