#include "deltacast/source.h"

#include "api/internal.h"
#include "codec/manifest.h"
#include "quant/serving.h"
#include "relay/producers/fp8_delta.h"
#include "relay/tree/node_transports.h"
#include "relay/tree/setup.h"
#include "relay/tree/source.h"

namespace deltacast {

namespace api {

PublishReport ToPublic(const relay::PublishReport& r) {
  PublishReport out;
  out.committed = r.committed;
  out.abort_reason = r.abort_reason;
  out.refit_id = r.refit_id;
  out.base_version = r.base_version.ToHex();
  out.target_version = r.target_version.ToHex();
  if (!r.bf16_target_version.IsZero()) {
    out.bf16_base_version = r.bf16_base_version.ToHex();
    out.bf16_target_version = r.bf16_target_version.ToHex();
  }
  out.delta_bytes = r.delta.delta_bytes;
  out.checkpoint_bytes = r.delta.tensor_bytes;
  out.chunks = r.delta.chunks;
  out.seconds = r.seconds;
  out.call_to_first_chunk_seconds = r.call_to_first_chunk_seconds;
  out.nodes_decided = r.nodes_decided;
  for (const auto& n : r.nodes) {
    out.nodes.push_back({n.node_id, n.chunk_bytes, n.apply_seconds, n.partitions_applied,
                         n.receive_seconds, n.check_seconds, n.write_seconds, n.apply_cpu_seconds,
                         n.cpu_wait_seconds, n.disk_wait_seconds, n.pause_seconds, n.hold_seconds});
  }
  return out;
}

}  // namespace api

namespace {

// The tensor tables must match exactly: a delta carries bytes, not a new model.
Status SameTensors(const apply::WeightStore& base, const apply::WeightStore& target) {
  if (base.tensors() == target.tensors()) return Status::Ok();
  for (size_t i = 0; i < std::min(base.tensors().size(), target.tensors().size()); ++i) {
    if (!(base.tensors()[i] == target.tensors()[i])) {
      return Status::InvalidArgument("the base and target tensors differ at '" +
                                     target.tensors()[i].name +
                                     "' (name, dtype or shape): a version must keep the model's "
                                     "tensors");
    }
  }
  return Status::InvalidArgument("the base has " + std::to_string(base.tensors().size()) +
                                 " tensors and the target " +
                                 std::to_string(target.tensors().size()));
}

}  // namespace

struct Source::Impl {
  Config config;
  SourceOptions options;
  std::unique_ptr<relay::Source> source;
};

Result<std::unique_ptr<Source>> Source::Start(const Config& config, SourceOptions options) {
  const topology::ClusterConfig& cluster = config.impl().cluster;
  ASSIGN_OR_RETURN(relay::PublishOptions publish,
                   relay::ConfiguredPublishOptions(cluster, options.token, options.state_dir,
                                                   options.keep_deltas));
  publish.codec.mode = options.context_mode ? codec::CodecMode::kContext : codec::CodecMode::kFast;
  publish.encode_threads = options.encode_threads;
  RETURN_IF_ERROR(api::AttachCommitRecords(cluster, publish));
  auto transport = relay::MakeNodeTransports(cluster, *cluster.Source());
  if (!transport.ok()) return transport.status();
  auto source = relay::Source::Start(std::move(publish), std::move(*transport));
  if (!source.ok()) return source.status();
  return std::unique_ptr<Source>(
      new Source(std::make_unique<Impl>(Impl{config, std::move(options), std::move(*source)})));
}

Source::Source(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Source::~Source() { Stop(); }
void Source::Stop() {
  if (impl_) impl_->source->Stop();
}
std::string Source::listen_address() const { return impl_->source->listen_address(); }
Status Source::SetVersion(const std::vector<TensorView>& current) {
  auto store = api::BorrowTensors(current);
  if (!store.ok()) return store.status().WithContext("tensors");
  impl_->source->Announce(
      codec::ComputeManifest((*store)->tensors(), [&](size_t i) { return (*store)->TensorData(i); },
                             codec::kDefaultPartitionBytes, impl_->options.encode_threads));
  return Status::Ok();
}

std::string Source::version() const {
  const Digest128 v = impl_->source->version();
  return v.IsZero() ? "" : v.ToHex();
}

Result<PublishReport> Source::Publish(const std::vector<TensorView>& base,
                                      const std::vector<TensorView>& target) {
  auto base_store = api::BorrowTensors(base);
  if (!base_store.ok()) return base_store.status().WithContext("base tensors");
  auto target_store = api::BorrowTensors(target);
  if (!target_store.ok()) return target_store.status().WithContext("target tensors");
  if (Status same = SameTensors(**base_store, **target_store); !same.ok()) return same;
  auto manifest_of = [&](const apply::WeightStore& store) {
    return codec::ComputeManifest(
        store.tensors(), [&](size_t i) { return store.TensorData(i); },
        codec::kDefaultPartitionBytes, impl_->options.encode_threads);
  };
  auto report = impl_->source->Publish(**base_store, manifest_of(**base_store), **target_store,
                                       manifest_of(**target_store));
  if (!report.ok()) return report.status();
  return api::ToPublic(*report);
}

Result<PublishReport> Source::PublishCheckpoints(const std::filesystem::path& base_dir,
                                                 const std::filesystem::path& new_dir,
                                                 const std::filesystem::path& serving) {
  if (!serving.empty()) {
    ASSIGN_OR_RETURN(quant::ServingDescription description, quant::LoadServing(serving));
    relay::ShareEncodeOptions encode;
    encode.codec.mode =
        impl_->options.context_mode ? codec::CodecMode::kContext : codec::CodecMode::kFast;
    encode.threads = impl_->options.encode_threads;
    encode.chunk_bytes = impl_->config.impl().cluster.tree.chunk_size;
    ASSIGN_OR_RETURN(
        relay::PublishReport report,
        relay::PublishCheckpointsFp8(*impl_->source, base_dir, new_dir, description, encode));
    return api::ToPublic(report);
  }
  auto base = relay::OpenCheckpointVersion(base_dir, impl_->options.encode_threads);
  if (!base.ok()) return base.status().WithContext("base checkpoint");
  auto target = relay::OpenCheckpointVersion(new_dir, impl_->options.encode_threads);
  if (!target.ok()) return target.status().WithContext("new checkpoint");
  if (Status same = relay::SameFileLayout(*base, *target); !same.ok()) return same;
  auto report =
      impl_->source->Publish(*base->store, base->manifest, *target->store, target->manifest);
  if (!report.ok()) return report.status();
  return api::ToPublic(*report);
}

}  // namespace deltacast
