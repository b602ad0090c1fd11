#include "deltacast/producer.h"

#include <algorithm>
#include <map>

#include "api/internal.h"
#include "apply/device/piece_memory.h"
#include "layout/placement.h"
#include "relay/producers/producer.h"
#include "relay/producers/root.h"
#include "relay/tree/node_transports.h"
#include "relay/tree/setup.h"

namespace deltacast {
namespace {

TensorSpec ToLayout(const TensorSpec& t) { return {t.name, t.dtype, t.shape}; }

// One of the producer's tensors: its previous and new bytes.
struct TensorPair {
  ByteSpan base, target;
  bool has_target = false;
};

// The producer's tensors by name, checked against the model; `base` and `target`
// must list the same tensors.
Result<std::map<std::string, TensorPair>> MatchViews(const std::map<std::string, TensorSpec>& model,
                                                     const std::vector<TensorView>& base,
                                                     const std::vector<TensorView>& target) {
  auto check = [&](const TensorView& v, const std::string& which) -> Status {
    auto it = model.find(v.spec.name);
    if (it == model.end()) {
      return Status::InvalidArgument(which + " tensor '" + v.spec.name + "' is not in the model");
    }
    if (!(it->second == ToLayout(v.spec))) {
      return Status::InvalidArgument(which + " tensor '" + v.spec.name +
                                     "' has another dtype or shape than the model's");
    }
    if (v.bytes.size() != v.spec.ByteSize()) {
      return Status::InvalidArgument(which + " tensor '" + v.spec.name + "' holds " +
                                     std::to_string(v.bytes.size()) + " bytes, not " +
                                     std::to_string(v.spec.ByteSize()));
    }
    return Status::Ok();
  };
  std::map<std::string, TensorPair> out;
  for (const TensorView& v : base) {
    RETURN_IF_ERROR(check(v, "base"));
    if (!out.emplace(v.spec.name,
                     TensorPair{ByteSpan(v.bytes.data(), v.bytes.size()), ByteSpan(), false})
             .second) {
      return Status::InvalidArgument("base tensor '" + v.spec.name + "' is listed twice");
    }
  }
  for (const TensorView& v : target) {
    RETURN_IF_ERROR(check(v, "target"));
    auto it = out.find(v.spec.name);
    if (it == out.end()) {
      return Status::InvalidArgument("target tensor '" + v.spec.name + "' has no base");
    }
    if (it->second.has_target) {
      return Status::InvalidArgument("target tensor '" + v.spec.name + "' is listed twice");
    }
    it->second.target = ByteSpan(v.bytes.data(), v.bytes.size());
    it->second.has_target = true;
  }
  for (const auto& [name, pair] : out) {
    if (!pair.has_target)
      return Status::InvalidArgument("base tensor '" + name + "' has no target");
  }
  if (out.empty()) return Status::InvalidArgument("a producer needs at least one tensor");
  return out;
}

}  // namespace

struct Producer::Impl {
  Result<ProduceReport> Serve(const std::vector<TensorView>& base,
                              const std::vector<TensorView>& target,
                              apply::device::PieceMemory* device);

  std::map<std::string, TensorSpec> model;
  std::unique_ptr<relay::Producer> producer;
  // ServeFromGpu's memory, kept between refits (its scratch buffers too).
  std::unique_ptr<apply::device::PieceMemory> memory;
  int memory_device = -2;
  // The placement of the tensors served last (rebuilt when the set changes).
  std::vector<std::string> names;
  layout::PlacementMap map;
};

Result<std::unique_ptr<Producer>> Producer::Connect(const Config& config, ProducerOptions options,
                                                    std::vector<TensorSpec> model) {
  const topology::ClusterConfig& cluster = config.impl().cluster;
  auto impl = std::make_unique<Impl>();
  for (const TensorSpec& t : model) {
    if (!impl->model.emplace(t.name, ToLayout(t)).second) {
      return Status::InvalidArgument("the model lists tensor '" + t.name + "' twice");
    }
  }
  if (options.id.empty()) return Status::InvalidArgument("a producer needs an id");
  auto transport = relay::MakeProducerTransport(cluster, options.id);
  if (!transport.ok()) return transport.status();
  relay::ProducerOptions o;
  o.id = options.id;
  o.tls = topology::ProducerLinksUseTls(cluster);
  o.root_address =
      options.root_address.empty() ? relay::DefaultProducerAddress(cluster) : options.root_address;
  o.root_id = cluster.Source()->id;
  o.token = options.token;
  o.codec.mode = options.context_mode ? codec::CodecMode::kContext : codec::CodecMode::kFast;
  o.threads = options.encode_threads;
  o.connect_timeout = cluster.tree.connect_timeout * 3;
  o.refit_timeout = cluster.tree.commit_timeout * 2;
  auto producer = relay::Producer::Connect(std::move(o), std::move(*transport));
  if (!producer.ok()) return producer.status();
  impl->producer = std::move(*producer);
  return std::unique_ptr<Producer>(new Producer(std::move(impl)));
}

Producer::Producer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Producer::~Producer() { Close(); }
void Producer::Close() {
  if (impl_) impl_->producer->Close();
}

Result<ProduceReport> Producer::Serve(const std::vector<TensorView>& base,
                                      const std::vector<TensorView>& target) {
  return impl_->Serve(base, target, nullptr);
}

Result<ProduceReport> Producer::ServeFromGpu(int device, const std::vector<TensorView>& base,
                                             const std::vector<TensorView>& target,
                                             uintptr_t stream) {
  if (!impl_->memory || impl_->memory_device != device) {
    if (device < 0) {
      impl_->memory = apply::device::NewHostPieceMemory();
    } else {
      ASSIGN_OR_RETURN(impl_->memory, apply::device::NewCudaPieceMemory(device));
    }
    impl_->memory_device = device;
  }
  RETURN_IF_ERROR(impl_->memory->AwaitStream(stream).WithContext("the trainer's stream"));
  return impl_->Serve(base, target, impl_->memory.get());
}

Result<ProduceReport> Producer::Impl::Serve(const std::vector<TensorView>& base,
                                            const std::vector<TensorView>& target,
                                            apply::device::PieceMemory* device) {
  ASSIGN_OR_RETURN(auto spans, MatchViews(model, base, target));
  std::vector<std::string> served;
  for (const auto& [name, s] : spans) served.push_back(name);  // sorted, as the map's locals
  if (served != names) {
    std::vector<TensorSpec> canonical;
    for (const auto& [name, spec] : model) canonical.push_back(spec);
    ASSIGN_OR_RETURN(map, layout::MapWhole(std::move(canonical), served));
    names = served;
  }
  std::vector<TensorPair> by_local;
  for (const auto& local : map.locals()) by_local.push_back(spans.at(local.spec.name));
  relay::ShareInput input{&map, [&](uint32_t i) { return by_local[i].base; },
                          [&](uint32_t i) { return by_local[i].target; }};
  if (device != nullptr) {
    // The spans are device addresses: only the addresses are used.
    input = {&map,
             {},
             {},
             device,
             [&](uint32_t i) { return by_local[i].base.data(); },
             [&](uint32_t i) { return by_local[i].target.data(); }};
  }
  ASSIGN_OR_RETURN(relay::ProduceReport r, producer->Serve(input));
  ProduceReport out;
  out.committed = r.committed;
  out.reason = r.reason;
  out.refit_id = r.refit_id;
  out.partitions = r.partitions;
  out.changed_elements = r.stats.changed_elements;
  out.sent_bytes = r.sent_bytes;
  out.encode_seconds = r.encode_seconds;
  out.seconds = r.seconds;
  return out;
}

struct Root::Impl {
  std::unique_ptr<relay::Root> root;
};

Result<std::unique_ptr<Root>> Root::Start(const Config& config, RootOptions options) {
  const topology::ClusterConfig& cluster = config.impl().cluster;
  if (options.producers == 0) return Status::InvalidArgument("a root needs at least one producer");
  relay::RootOptions o;
  ASSIGN_OR_RETURN(o.publish, relay::ConfiguredPublishOptions(
                                  cluster, options.token, options.state_dir, options.keep_deltas));
  RETURN_IF_ERROR(api::AttachCommitRecords(cluster, o.publish));
  o.producers = options.producers;
  o.producer_address = options.producer_address.empty() ? relay::DefaultProducerAddress(cluster)
                                                        : options.producer_address;
  o.join_timeout = cluster.tree.connect_timeout * 3;
  o.produce_timeout = cluster.tree.commit_timeout;
  auto tree = relay::MakeNodeTransports(cluster, *cluster.Source());
  if (!tree.ok()) return tree.status();
  auto producers = relay::MakeProducerTransport(cluster, cluster.Source()->id);
  if (!producers.ok()) return producers.status();
  auto root = relay::Root::Start(std::move(o), std::move(*tree), std::move(*producers));
  if (!root.ok()) return root.status();
  return std::unique_ptr<Root>(new Root(std::make_unique<Impl>(Impl{std::move(*root)})));
}

Root::Root(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Root::~Root() { Stop(); }
void Root::Stop() {
  if (impl_) impl_->root->Stop();
}
std::string Root::producer_address() const { return impl_->root->producer_address(); }
std::string Root::listen_address() const { return impl_->root->listen_address(); }

Result<PublishReport> Root::Publish() {
  auto report = impl_->root->Publish();
  if (!report.ok()) return report.status();
  return api::ToPublic(report->publish);
}

}  // namespace deltacast
