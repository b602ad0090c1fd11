#include "relay/producers/fp8_delta.h"

#include <chrono>
#include <map>

#include "codec/partition.h"
#include "common/partition_hash.h"
#include "layout/placement.h"
#include "relay/producers/fp8_share.h"
#include "relay/producers/merge.h"

namespace deltacast::relay {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TensorSpec Info(const TensorSpec& t) { return {t.name, t.dtype, t.shape}; }

// One group's share report and chunks.
Status EncodeGroup(const apply::WeightStore& base, const apply::WeightStore& target,
                   const std::vector<TensorSpec>& canonical,
                   const std::map<std::string, size_t>& store_index, std::vector<std::string> names,
                   const std::vector<quant::ServedTensor>& plan, const ShareEncodeOptions& options,
                   ShareReport& report, Fp8Delta& out) {
  ASSIGN_OR_RETURN(layout::PlacementMap map, layout::MapWhole(canonical, std::move(names)));
  std::vector<size_t> local_to_store;
  for (const layout::LocalTensor& l : map.locals())
    local_to_store.push_back(store_index.at(l.spec.name));
  ShareInput bf16;
  bf16.map = &map;
  bf16.base = [&](uint32_t i) { return base.TensorData(local_to_store[i]); };
  bf16.target = [&](uint32_t i) { return target.TensorData(local_to_store[i]); };
  ASSIGN_OR_RETURN(auto share, Fp8Share::Plan(bf16, plan));
  RETURN_IF_ERROR(share->ComputeAmaxes(options.threads));
  if (!share->SplitBlocks().empty()) {
    return Status::Internal("a group of whole tensors holds a block in part");
  }
  RETURN_IF_ERROR(share->Quantize(options.threads));
  out.stats.quantized_bf16_bytes += share->stats().quantized_bf16_bytes;
  out.stats.quantize_seconds += share->stats().amax_seconds + share->stats().quantize_seconds;

  const auto start = std::chrono::steady_clock::now();
  const ShareInput image = share->Input();
  report.coverage = ShareCoverage(share->map(), options.partition_bytes);
  ASSIGN_OR_RETURN(report.base_pieces,
                   HashShare(image, report.coverage, options.partition_bytes, options.threads));
  std::vector<PartitionHash> base_hashes(report.coverage.size());
  for (size_t i = 0; i < report.coverage.size(); ++i) {
    const PartitionShare& c = report.coverage[i];
    const uint64_t bytes = c.length * ElementSize(share->map().canonical()[c.tensor].dtype);
    base_hashes[i] = CombinePieces(std::span(&report.base_pieces[i], 1), bytes);
  }
  ASSIGN_OR_RETURN(EncodedShare encoded, EncodeShare(image, report.coverage, base_hashes, options));
  if (!encoded.pieces.empty()) return Status::Internal("a group of whole tensors made pieces");
  report.changes = std::move(encoded.changes);
  report.proof = std::move(encoded.base_pieces);
  out.stats.changed_elements += encoded.stats.changed_elements;
  for (auto& chunk : encoded.chunks) out.chunks.push_back(std::move(chunk));
  out.stats.encode_seconds += Since(start);
  return Status::Ok();
}

}  // namespace

Result<Fp8Delta> EncodeFp8Delta(const apply::WeightStore& base, const apply::WeightStore& target,
                                const quant::ServingDescription& serving,
                                const ShareEncodeOptions& options, uint64_t group_bytes) {
  const auto start = std::chrono::steady_clock::now();
  if (base.tensors() != target.tensors()) {
    return Status::InvalidArgument(
        "the two versions hold different tensors: a delta carries tensor bytes only");
  }
  std::vector<TensorSpec> canonical;
  std::map<std::string, size_t> store_index;
  for (size_t i = 0; i < target.tensors().size(); ++i) {
    const TensorSpec& t = target.tensors()[i];
    canonical.push_back({t.name, t.dtype, t.shape});
    store_index[t.name] = i;
  }
  std::sort(canonical.begin(), canonical.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  ASSIGN_OR_RETURN(std::vector<quant::ServedTensor> plan, quant::PlanServing(serving, canonical));
  std::vector<TensorSpec> table;
  for (const TensorSpec& t : Fp8CanonicalTable(plan)) table.push_back(Info(t));

  Fp8Delta out;
  std::vector<ShareReport> reports;
  std::vector<std::string> group;
  uint64_t bytes = 0;
  auto flush = [&]() -> Status {
    if (group.empty()) return Status::Ok();
    ShareReport& report = reports.emplace_back();
    report.producer = "tensor group " + std::to_string(reports.size() - 1);
    Status s = EncodeGroup(base, target, canonical, store_index, std::move(group), plan, options,
                           report, out);
    group.clear();
    bytes = 0;
    return s;
  };
  reports.reserve(canonical.size());
  for (const TensorSpec& t : canonical) {
    const uint64_t size = t.ByteSize();
    if (!group.empty() && bytes + size > group_bytes) RETURN_IF_ERROR(flush());
    group.push_back(t.name);
    bytes += size;
    out.stats.bf16_bytes += size;
  }
  RETURN_IF_ERROR(flush());
  out.stats.groups = reports.size();

  std::vector<const ShareReport*> shares;
  for (const ShareReport& r : reports) shares.push_back(&r);
  RETURN_IF_ERROR(CheckShares(table, options.partition_bytes, shares));
  ASSIGN_OR_RETURN(out.base, CombineBaseManifest(table, options.partition_bytes, shares));
  ASSIGN_OR_RETURN(out.target, CombineTargetManifest(out.base, shares));
  out.stats.seconds = Since(start);
  return out;
}

Result<PublishReport> PublishFp8Delta(Source& source, const Fp8Delta& delta, uint64_t chunk_bytes) {
  auto stream = [&](const Source::ChunkMessageSink& sink, codec::DeltaStats* stats) -> Status {
    DeltaMerger merger(delta.base, delta.target, chunk_bytes, sink);
    for (const auto& chunk : delta.chunks) RETURN_IF_ERROR(merger.AddChunk(chunk));
    RETURN_IF_ERROR(merger.Finish(delta.stats.changed_elements, stats));
    if (stats) stats->seconds = delta.stats.seconds;
    return Status::Ok();
  };
  return source.PublishStream(delta.base, delta.target, stream);
}

namespace {

// Both BF16 versions opened (their manifests from the caches or hashed) and encoded.
struct Fp8Publish {
  CheckpointVersion base, target;
  Fp8Delta delta;
};

Result<Fp8Publish> EncodeCheckpointsFp8(const std::filesystem::path& base_dir,
                                        const std::filesystem::path& new_dir,
                                        const quant::ServingDescription& serving,
                                        const ShareEncodeOptions& options) {
  Fp8Publish p;
  auto base = OpenCheckpointVersion(base_dir, options.threads);
  if (!base.ok()) return base.status().WithContext("base checkpoint");
  p.base = std::move(*base);
  auto target = OpenCheckpointVersion(new_dir, options.threads);
  if (!target.ok()) return target.status().WithContext("new checkpoint");
  p.target = std::move(*target);
  RETURN_IF_ERROR(SameFileLayout(p.base, p.target));
  ASSIGN_OR_RETURN(p.delta, EncodeFp8Delta(*p.base.store, *p.target.store, serving, options));
  return p;
}

Result<PublishReport> Published(Result<PublishReport> report, const Fp8Publish& p) {
  if (!report.ok()) return report.status();
  report->bf16_base_version = p.base.manifest.VersionId();
  report->bf16_target_version = p.target.manifest.VersionId();
  return report;
}

}  // namespace

Result<PublishReport> PublishCheckpointsFp8(Source& source, const std::filesystem::path& base_dir,
                                            const std::filesystem::path& new_dir,
                                            const quant::ServingDescription& serving,
                                            const ShareEncodeOptions& options) {
  ASSIGN_OR_RETURN(Fp8Publish p, EncodeCheckpointsFp8(base_dir, new_dir, serving, options));
  return Published(PublishFp8Delta(source, p.delta, options.chunk_bytes), p);
}

Result<PublishReport> PublishCheckpointsFp8(const PublishOptions& options,
                                            const std::filesystem::path& base_dir,
                                            const std::filesystem::path& new_dir,
                                            const quant::ServingDescription& serving,
                                            std::unique_ptr<transport::Transport> transport) {
  ShareEncodeOptions encode;
  encode.codec = options.codec;
  encode.threads = options.encode_threads;
  encode.partition_bytes = codec::kDefaultPartitionBytes;
  encode.chunk_bytes = options.config.tree.chunk_size;
  ASSIGN_OR_RETURN(Fp8Publish p, EncodeCheckpointsFp8(base_dir, new_dir, serving, encode));
  ASSIGN_OR_RETURN(auto source, Source::Start(options, std::move(transport)));
  auto report = PublishFp8Delta(*source, p.delta, encode.chunk_bytes);
  source->Stop();
  return Published(std::move(report), p);
}

}  // namespace deltacast::relay
