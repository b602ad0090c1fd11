#include "agent/commands.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "agent/fp8_twin.h"
#include "agent/store_commands.h"
#include "apply/checkpoint_delta.h"
#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "apply/delta_file.h"
#include "codec/chunk.h"
#include "common/parallel.h"
#include "common/progress.h"

namespace deltacast::agent {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

int Fail(const Status& status) {
  fmt::print(stderr, "deltacast: {}\n", status.ToString());
  return kExitFailure;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::string HumanBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} {}", bytes, kUnits[unit])
                   : fmt::format("{:.2f} {}", bytes, kUnits[unit]);
}

json EncodingCounts(const std::array<uint64_t, codec::kMaxEncoding + 1>& counts) {
  json out = json::object();
  for (uint8_t e = 1; e <= codec::kMaxEncoding; ++e) {
    if (counts[e] != 0)
      out[std::string(codec::EncodingName(static_cast<codec::Encoding>(e)))] = counts[e];
  }
  return out;
}

// xxh3-128 of a whole file, read in large blocks.
Result<Digest128> HashFile(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path.string());
  Hasher128 hasher;
  std::vector<std::byte> buffer(8 << 20);
  Status status;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = Status::FromErrno(errno, "read " + path.string());
      break;
    }
    if (n == 0) break;
    hasher.Update(ByteSpan(buffer.data(), static_cast<size_t>(n)));
  }
  ::close(fd);
  if (!status.ok()) return status;
  return hasher.Finish();
}

// Relative path -> hash of every regular file under `dir`, except deltacast's own state.
Result<std::map<std::string, Digest128>> HashTree(const std::filesystem::path& dir,
                                                  size_t threads) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory() && it->path().filename() == apply::kStateDirName) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(it->path());
  }
  if (ec) return Status::IoError("list " + dir.string() + ": " + ec.message());
  std::vector<Result<Digest128>> hashes(files.size(), Status::Internal("not hashed"));
  ParallelFor(files.size(), threads, [&](size_t i) { hashes[i] = HashFile(files[i]); });
  std::map<std::string, Digest128> out;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!hashes[i].ok()) return hashes[i].status();
    out[std::filesystem::relative(files[i], dir).string()] = *hashes[i];
  }
  return out;
}

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) {
    ++digits;
  }
  if (digits == 0) return Status::InvalidArgument("'" + std::string(text) + "' is not a size");
  double value;
  try {
    value = std::stod(std::string(text.substr(0, digits)));
  } catch (...) {
    return Status::InvalidArgument("'" + std::string(text) + "' is not a size");
  }
  std::string unit(text.substr(digits));
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {{"", 1},
                                                       {"B", 1},
                                                       {"K", 1024.0},
                                                       {"KB", 1024.0},
                                                       {"KIB", 1024.0},
                                                       {"M", 1 << 20},
                                                       {"MB", 1 << 20},
                                                       {"MIB", 1 << 20},
                                                       {"G", 1 << 30},
                                                       {"GB", 1 << 30},
                                                       {"GIB", 1 << 30},
                                                       {"T", 1099511627776.0},
                                                       {"TB", 1099511627776.0},
                                                       {"TIB", 1099511627776.0}};
  auto it = kUnits.find(unit);
  if (it == kUnits.end())
    return Status::InvalidArgument("unknown size unit in '" + std::string(text) + "'");
  const double bytes = value * it->second;
  if (bytes < 1 || bytes > 1e18)
    return Status::InvalidArgument("size '" + std::string(text) + "' is out of range");
  return static_cast<uint64_t>(bytes);
}

int RunSynth(const SynthOptions& synth_options, bool json_out, const SynthFp8& fp8) {
  const auto start = Clock::now();
  SynthOptions options = synth_options;
  // The serving description is checked before anything is written.
  quant::ServingDescription serving;
  if (fp8.enabled) {
    if (!fp8.serving.empty()) {
      auto loaded = quant::LoadServing(fp8.serving);
      if (!loaded.ok()) return Fail(loaded.status());
      serving = *loaded;
    } else {
      serving = DefaultFp8Serving(fp8.scheme);
      if (serving.scheme == nullptr) {
        return Fail(Status::InvalidArgument("--fp8-scheme: unknown scheme '" + fp8.scheme +
                                            "' (known: " + quant::Fp8SchemeNames() + ")"));
      }
    }
  }
  auto bar = progress::Progress::ForTerminal("synth", !json_out);
  if (bar->enabled()) {
    options.on_progress = [&bar](uint64_t done, uint64_t total) {
      bar->SetTotal(total);
      bar->Set(done);
    };
  }
  auto report = Synthesize(options);
  bar->Finish();
  if (!report.ok()) return Fail(report.status());
  json fp8_dirs = json::array();
  if (fp8.enabled) {
    for (int k = std::max(fp8.first_step, 0); k <= options.steps; ++k) {
      const auto dir = options.out_dir / ("step" + std::to_string(k));
      const auto twin = options.out_dir / ("step" + std::to_string(k) + "-fp8");
      const Status st = WriteFp8Twin(dir, twin, serving, options.threads);
      if (!st.ok()) return Fail(st);
      fp8_dirs.push_back(twin.string());
    }
  }
  const double seconds = Seconds(start);
  if (json_out) {
    json steps = json::array();
    for (size_t k = 0; k < report->measured_change_rate.size(); ++k) {
      const auto& st = report->step_stats[k];
      steps.push_back(
          {{"step", k + 1},
           {"change_rate", report->measured_change_rate[k]},
           {"changed", st.changed},
           {"one_ulp_fraction", st.changed ? double(st.one_ulp) / st.changed : 0.0},
           {"low_run_xor_fraction", st.changed ? double(st.xor_low_run) / st.changed : 0.0},
           {"sign_flips", st.sign_flips}});
    }
    fmt::print("{}\n", json{{"out", options.out_dir.string()},
                            {"params", report->params},
                            {"tensors", report->tensors.size()},
                            {"layers", report->layers},
                            {"hidden", report->hidden},
                            {"vocab", report->vocab},
                            {"shards", report->shards},
                            {"shard_ranks", report->shard_ranks},
                            {"experts", report->experts},
                            {"bytes_per_checkpoint", report->bytes_per_checkpoint},
                            {"lr", report->lr},
                            {"steps", steps},
                            {"fp8", fp8.enabled ? json{{"scheme", serving.scheme->name},
                                                       {"dirs", fp8_dirs}}
                                                : json(nullptr)},
                            {"seconds", seconds}}
                           .dump(2));
    return kExitOk;
  }
  fmt::print(
      "synthesized {} params ({} layers, hidden {}, vocab {}) in {} shards, {} per checkpoint\n",
      report->params, report->layers, report->hidden, report->vocab, report->shards,
      HumanBytes(double(report->bytes_per_checkpoint)));
  fmt::print("lr {:.3g}; wrote {}/step0 .. step{} in {:.1f} s\n", report->lr,
             options.out_dir.string(), options.steps, seconds);
  for (size_t k = 0; k < report->measured_change_rate.size(); ++k) {
    const auto& st = report->step_stats[k];
    fmt::print("  step {}: {:.2f}% of elements changed, {:.1f}% of them by one ULP\n", k + 1,
               100 * report->measured_change_rate[k],
               st.changed ? 100.0 * st.one_ulp / st.changed : 0.0);
  }
  if (fp8.enabled) {
    fmt::print("FP8 serving twins ({}): {}/step{}-fp8 .. step{}-fp8\n", serving.scheme->name,
               options.out_dir.string(), std::max(fp8.first_step, 0), options.steps);
  }
  return kExitOk;
}

int RunManifest(const ManifestArgs& args) {
  auto store =
      apply::CheckpointDirStore::Open(args.dir, apply::CheckpointDirStore::Access::kReadOnly);
  if (!store.ok()) return Fail(store.status());
  const auto start = Clock::now();
  auto manifest = apply::CheckpointState(args.dir).LoadOrComputeManifest(
      **store, args.partition_bytes, args.threads ? args.threads : DefaultThreadCount());
  if (!manifest.ok()) return Fail(manifest.status());
  const double seconds = Seconds(start);
  const std::string version = manifest->VersionId().ToHex();
  const std::string layout = (*store)->LayoutId().ToHex();
  if (args.json) {
    json tensors = json::array();
    for (size_t t = 0; t < manifest->tensors.size(); ++t) {
      const auto& info = manifest->tensors[t];
      json entry = {{"name", info.name}, {"dtype", DTypeName(info.dtype)}, {"shape", info.shape}};
      if (args.partitions) {
        json hashes = json::array();
        for (const PartitionHash& h : manifest->partition_hashes[t]) hashes.push_back(h.ToHex());
        entry["partition_hashes"] = hashes;
      }
      tensors.push_back(entry);
    }
    fmt::print("{}\n", json{{"dir", args.dir.string()},
                            {"version", version},
                            {"layout", layout},
                            {"partition_bytes", manifest->partition_bytes},
                            {"tensor_bytes", manifest->TotalBytes()},
                            {"partitions", manifest->PartitionTotal()},
                            {"seconds", seconds},
                            {"tensors", tensors}}
                           .dump(2));
    return kExitOk;
  }
  fmt::print("version    {}\nlayout     {}\ntensors    {}\nbytes      {}\npartitions {} of {}\n",
             version, layout, manifest->tensors.size(), HumanBytes(double(manifest->TotalBytes())),
             manifest->PartitionTotal(), HumanBytes(double(manifest->partition_bytes)));
  if (args.partitions) {
    for (size_t t = 0; t < manifest->tensors.size(); ++t) {
      for (size_t p = 0; p < manifest->partition_hashes[t].size(); ++p) {
        fmt::print("{} [{}] {}\n", manifest->tensors[t].name, p,
                   manifest->partition_hashes[t][p].ToHex());
      }
    }
  }
  return kExitOk;
}

int RunDiff(const DiffArgs& args) {
  apply::DiffOptions options{args.encoder, args.partition_bytes};
  auto bar = progress::Progress::ForTerminal("encode", !args.json);
  if (bar->enabled()) {
    options.encoder.on_progress = [&bar](uint64_t done, uint64_t total) {
      bar->SetTotal(total);
      bar->Set(done);
    };
  }
  auto result = apply::DiffCheckpoints(args.base, args.target, args.out, options);
  bar->Finish();
  if (!result.ok()) return Fail(result.status());
  const auto& s = result->stats;
  const double gbps = s.seconds > 0 ? double(s.tensor_bytes) / s.seconds / 1e9 : 0;
  if (args.json) {
    fmt::print(
        "{}\n",
        json{{"base_version", result->identity.base_version.ToHex()},
             {"target_version", result->identity.target_version.ToHex()},
             {"out", args.out.string()},
             {"tensor_bytes", s.tensor_bytes},
             {"delta_bytes", s.delta_bytes},
             {"ratio", double(s.delta_bytes) / double(std::max<uint64_t>(s.tensor_bytes, 1))},
             {"bits_per_param",
              8.0 * double(s.delta_bytes) / double(std::max<uint64_t>(s.total_elements, 1))},
             {"changed_elements", s.changed_elements},
             {"total_elements", s.total_elements},
             {"partitions", s.partitions},
             {"changed_partitions", s.changed_partitions},
             {"chunks", s.chunks},
             {"records_by_encoding", EncodingCounts(s.records_by_encoding)},
             {"payload_bytes_by_encoding", EncodingCounts(s.payload_bytes_by_encoding)},
             {"manifest_seconds", result->manifest_seconds},
             {"encode_seconds", s.seconds},
             {"encode_gbps", gbps}}
            .dump(2));
    return kExitOk;
  }
  fmt::print("delta {} -> {}: {} for {} of tensors ({:.2f}%, {:.3f} bits/param)\n",
             result->identity.base_version.ShortHex(), result->identity.target_version.ShortHex(),
             HumanBytes(double(s.delta_bytes)), HumanBytes(double(s.tensor_bytes)),
             100.0 * double(s.delta_bytes) / double(std::max<uint64_t>(s.tensor_bytes, 1)),
             8.0 * double(s.delta_bytes) / double(std::max<uint64_t>(s.total_elements, 1)));
  fmt::print("changed {} of {} elements ({:.2f}%) in {} of {} partitions; {} chunks\n",
             s.changed_elements, s.total_elements,
             100.0 * double(s.changed_elements) / double(std::max<uint64_t>(s.total_elements, 1)),
             s.changed_partitions, s.partitions, s.chunks);
  for (uint8_t e = 1; e <= codec::kMaxEncoding; ++e) {
    if (s.records_by_encoding[e] == 0) continue;
    fmt::print("  {:<12} {:>8} partitions {:>12}\n",
               codec::EncodingName(static_cast<codec::Encoding>(e)), s.records_by_encoding[e],
               HumanBytes(double(s.payload_bytes_by_encoding[e])));
  }
  fmt::print("encode {:.2f} s ({:.2f} GB/s of checkpoint), manifests {:.2f} s\n", s.seconds, gbps,
             result->manifest_seconds);
  return kExitOk;
}

int RunPatch(const PatchArgs& args) {
  const auto start = Clock::now();
  auto result = apply::PatchCheckpoint(args.store, args.delta, {args.threads, args.repair_from});
  if (!result.ok()) return Fail(result.status());
  const double seconds = Seconds(start);
  static constexpr const char* kOutcome[] = {"applied", "resumed", "already-at-target"};
  const auto& r = result->report;
  const char* outcome = kOutcome[static_cast<int>(result->outcome)];
  if (args.json) {
    fmt::print("{}\n", json{{"store", args.store.string()},
                            {"outcome", outcome},
                            {"version", result->identity.target_version.ToHex()},
                            {"chunks", r.chunks},
                            {"records", r.records},
                            {"applied", r.applied},
                            {"already_at_target", r.already_at_target},
                            {"changed_elements", r.changed_elements},
                            {"apply_seconds", r.seconds},
                            {"seconds", seconds}}
                           .dump(2));
    return kExitOk;
  }
  fmt::print("{}: {} -> {} {} ({} partitions patched, {} already at target) in {:.2f} s\n",
             args.store.string(), result->identity.base_version.ShortHex(),
             result->identity.target_version.ShortHex(), outcome, r.applied, r.already_at_target,
             seconds);
  return kExitOk;
}

int RunInspect(const InspectArgs& args) {
  auto reader = apply::DeltaFileReader::Open(args.delta);
  if (!reader.ok()) return Fail(reader.status());
  json chunks = json::array();
  std::array<uint64_t, codec::kMaxEncoding + 1> records{}, bytes{};
  uint64_t total = 0, changed = 0;
  std::optional<codec::DeltaSummary> summary;
  codec::DeltaIdentity identity;
  for (;;) {
    auto next = (*reader)->Next();
    if (!next.ok()) return Fail(next.status());
    if (!*next) break;
    auto chunk = codec::ParseChunk(**next);
    if (!chunk.ok()) return Fail(chunk.status().WithContext(args.delta.string()));
    identity = chunk->identity;
    total += chunk->size_bytes;
    if (chunk->kind == codec::ChunkKind::kEnd) {
      summary = chunk->summary;
      continue;
    }
    json rec = json::array();
    for (const auto& r : chunk->records) {
      const auto e = static_cast<size_t>(r.encoding);
      records[e]++;
      bytes[e] += r.payload.size();
      changed += r.change_count;
      if (args.records) {
        if (args.json) {
          rec.push_back({{"tensor", r.tensor_name},
                         {"element_offset", r.element_offset},
                         {"elements", r.element_count},
                         {"changes", r.change_count},
                         {"encoding", codec::EncodingName(r.encoding)},
                         {"payload_bytes", r.payload.size()}});
        } else {
          fmt::print("  chunk {:>4} {:<48} @{:<10} {:>9} changes {:<12} {:>10} B\n",
                     chunk->sequence, r.tensor_name, r.element_offset, r.change_count,
                     codec::EncodingName(r.encoding), r.payload.size());
        }
      }
    }
    json c = {{"sequence", chunk->sequence},
              {"bytes", chunk->size_bytes},
              {"records", chunk->records.size()}};
    if (args.records) c["record_list"] = rec;
    chunks.push_back(c);
  }
  if (!summary) return Fail(Status::Corrupt(args.delta.string() + " ends without an END chunk"));
  if (args.json) {
    fmt::print("{}\n", json{{"base_version", identity.base_version.ToHex()},
                            {"target_version", identity.target_version.ToHex()},
                            {"target_layout", summary->target_layout.ToHex()},
                            {"partition_bytes", identity.partition_bytes},
                            {"bytes", total},
                            {"data_chunks", summary->data_chunks},
                            {"records", summary->records},
                            {"changed_elements", changed},
                            {"tensor_bytes", summary->tensor_bytes},
                            {"records_by_encoding", EncodingCounts(records)},
                            {"payload_bytes_by_encoding", EncodingCounts(bytes)},
                            {"chunks", chunks}}
                           .dump(2));
    return kExitOk;
  }
  fmt::print("base     {}\ntarget   {}\nlayout   {}\n", identity.base_version.ToHex(),
             identity.target_version.ToHex(), summary->target_layout.ToHex());
  fmt::print("size     {} in {} data chunks + END; partitions of {}\n", HumanBytes(double(total)),
             summary->data_chunks, HumanBytes(double(identity.partition_bytes)));
  fmt::print("records  {} ({} changed elements) for a {} checkpoint\n", summary->records, changed,
             HumanBytes(double(summary->tensor_bytes)));
  for (uint8_t e = 1; e <= codec::kMaxEncoding; ++e) {
    if (records[e] == 0) continue;
    fmt::print("  {:<12} {:>8} records {:>12}\n",
               codec::EncodingName(static_cast<codec::Encoding>(e)), records[e],
               HumanBytes(double(bytes[e])));
  }
  return kExitOk;
}

int RunVerify(const VerifyArgs& args) {
  const size_t threads = args.threads ? args.threads : DefaultThreadCount();
  // A snapshot store is read as its committed version (snapshot + chain, in memory).
  auto a = OpenCommittedCheckpoint(args.a, threads);
  if (!a.ok()) return Fail(a.status().WithContext(args.a.string()));
  auto b = OpenCommittedCheckpoint(args.b, threads);
  if (!b.ok()) return Fail(b.status().WithContext(args.b.string()));
  const codec::Manifest* ma = &a->manifest;
  const codec::Manifest* mb = &b->manifest;
  auto ha = HashTree(a->store->dir(), threads);
  if (!ha.ok()) return Fail(ha.status());
  auto hb = HashTree(b->store->dir(), threads);
  if (!hb.ok()) return Fail(hb.status());
  if (a->snapshot_store || b->snapshot_store) {
    // A snapshot store's safetensors files hold its snapshot, not its committed
    // version: their tensor bytes are compared by the manifests, the rest of their
    // bytes (headers) by the layout ids.
    for (const auto* side : {&*a, &*b}) {
      for (const apply::CheckpointFile& f : side->store->layout().files) {
        ha->erase(f.name);
        hb->erase(f.name);
      }
    }
  }

  std::vector<std::string> differing;
  for (const auto& [name, hash] : *ha) {
    auto it = hb->find(name);
    if (it == hb->end())
      differing.push_back(name + " (only in " + args.a.string() + ")");
    else if (it->second != hash)
      differing.push_back(name);
  }
  for (const auto& [name, hash] : *hb) {
    if (!ha->contains(name)) differing.push_back(name + " (only in " + args.b.string() + ")");
  }
  const bool same_manifest =
      ma->VersionId() == mb->VersionId() && a->store->LayoutId() == b->store->LayoutId();
  const bool identical = same_manifest && differing.empty();
  if (args.json) {
    fmt::print("{}\n", json{{"identical", identical},
                            {"manifest_equal", same_manifest},
                            {"version_a", ma->VersionId().ToHex()},
                            {"version_b", mb->VersionId().ToHex()},
                            {"files_compared", ha->size()},
                            {"differing_files", differing}}
                           .dump(2));
  } else {
    fmt::print("{} {}: manifests {} (versions {} / {}), {} files hashed, {} differ\n",
               identical ? "IDENTICAL" : "DIFFERENT", args.a.string() + " vs " + args.b.string(),
               same_manifest ? "equal" : "differ", ma->VersionId().ShortHex(),
               mb->VersionId().ShortHex(), ha->size(), differing.size());
    for (const auto& d : differing) fmt::print("  differs: {}\n", d);
  }
  return identical ? kExitOk : kExitDiffers;
}

}  // namespace deltacast::agent
