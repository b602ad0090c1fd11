#include "relay/producers/root.h"

#include <fmt/core.h>
#include <openssl/rand.h>
#include <time.h>

#include <algorithm>
#include <map>
#include <set>

#include "common/elapsed.h"
#include "common/log.h"
#include "relay/producers/merge.h"
#include "relay/producers/producer_protocol.h"
#include "relay/producers/refit_assembly.h"
#include "relay/tree/node_transports.h"

namespace deltacast::relay {

std::string DefaultProducerAddress(const topology::ClusterConfig& config) {
  const auto* source = config.Source();
  return source->host + ":" + std::to_string(source->port + kProducerPortOffset);
}

namespace {

using Clock = std::chrono::steady_clock;

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

uint64_t RandomId() {
  uint64_t id = 0;
  while (id == 0) RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof id);
  return id;
}

// One refit's conversation with the producers, on the publishing thread.
class Conversation {
 public:
  Conversation(ProducerHub& hub, const RootOptions& options, uint64_t refit_id,
               std::vector<std::string> ids)
      : hub_(hub), options_(options), refit_id_(refit_id), ids_(std::move(ids)) {}

  void EndAll(bool committed, const std::string& reason) {
    for (const auto& id : ids_) {
      hub_.Send(id, EncodeProduceEnd({refit_id_, committed, reason.substr(0, 1024)}));
    }
  }

  // The next message of this refit from a producer; a loss, FAILED or a refused
  // message is an error naming the producer.
  Result<std::pair<std::string, transport::Message>> Next(std::string_view phase) {
    while (true) {
      auto ev = hub_.Next(options_.produce_timeout);
      if (!ev.ok())
        return ev.status().WithContext("waiting for the producers' " + std::string(phase));
      if (!ev->message) {
        return Status::Aborted("producer " + ev->producer + " was lost " + std::string(phase) +
                               ": " + ev->lost.ToString());
      }
      auto type = PeekType(ByteSpan(*ev->message));
      if (!type.ok()) return type.status().WithContext("from producer " + ev->producer);
      if (*type == MessageType::kFailed) {
        auto f = ParseFailed(ByteSpan(*ev->message));
        if (f.ok() && f->refit_id != refit_id_) continue;
        return Status::Aborted("producer " + ev->producer +
                               " failed: " + (f.ok() ? f->reason : f.status().ToString()));
      }
      return std::pair{ev->producer, ev->message};
    }
  }

  const std::vector<std::string>& ids() const { return ids_; }
  uint64_t refit_id() const { return refit_id_; }

 private:
  ProducerHub& hub_;
  const RootOptions& options_;
  const uint64_t refit_id_;
  const std::vector<std::string> ids_;
};

Status WrongMessage(const std::string& producer, ByteSpan message, std::string_view wanted) {
  auto type = PeekType(message);
  return Status::Corrupt("producer " + producer + " sent " +
                         (type.ok() ? std::string(MessageTypeName(*type)) : "garbage") +
                         ", expected " + std::string(wanted));
}

}  // namespace

Root::Root(RootOptions options, std::unique_ptr<Source> source,
           std::unique_ptr<transport::Transport> producer_transport)
    : options_(std::move(options)),
      source_(std::move(source)),
      producer_transport_(std::move(producer_transport)) {}

Root::~Root() { Stop(); }

void Root::Stop() {
  if (hub_) hub_->Close();
  if (producer_transport_) producer_transport_->Shutdown();
  if (source_) source_->Stop();
}

Result<std::unique_ptr<Root>> Root::Start(
    RootOptions options, std::unique_ptr<transport::Transport> tree_transport,
    std::unique_ptr<transport::Transport> producer_transport) {
  if (options.producers == 0) return Status::InvalidArgument("a root needs at least one producer");
  // Checked before anything listens: a root that must encrypt producer links but
  // cannot would refuse every producer, later and less clearly.
  RETURN_IF_ERROR(CheckProducerLinkSecurity(options.publish.config));
  const std::string root_id = options.publish.config.Source()->id;
  const std::string token = options.publish.token;
  ASSIGN_OR_RETURN(auto source, Source::Start(options.publish, std::move(tree_transport)));
  std::unique_ptr<Root> root(
      new Root(std::move(options), std::move(source), std::move(producer_transport)));
  root->hub_ =
      std::make_unique<ProducerHub>(root_id, token, root->options_.producers,
                                    HandshakeLimitsFrom(root->options_.publish.config.limits));
  root->hub_->RequireTls(topology::ProducerLinksUseTls(root->options_.publish.config));
  ASSIGN_OR_RETURN(root->producer_address_,
                   root->hub_->Listen(*root->producer_transport_, root->options_.producer_address));
  return root;
}

Result<RootReport> Root::Publish(const codec::Manifest* base_in) {
  RootReport report;
  RETURN_IF_ERROR(hub_->WaitFor(options_.producers, options_.join_timeout));
  hub_->DropEvents();
  Conversation talk(*hub_, options_, RandomId(), hub_->Joined());
  const codec::Manifest* known = base_in ? base_in : (last_target_ ? &*last_target_ : nullptr);
  const uint64_t partition_bytes = known ? known->partition_bytes : options_.partition_bytes;
  const uint64_t chunk_bytes = options_.publish.config.tree.chunk_size;
  const auto start = Clock::now();
  auto fail = [&](const Status& s) {
    talk.EndAll(false, s.ToString());
    log::Warn("refit from producers not started: " + s.ToString());
    return s;
  };
  for (const auto& id : talk.ids()) {
    hub_->Send(id,
               EncodeProduce({talk.refit_id(), partition_bytes, chunk_bytes, known == nullptr}));
  }

  // 1. Coverage (and base pieces): exact coverage, the base manifest.
  const bool from_last = base_in == nullptr && last_target_.has_value();
  RefitAssembly assembly(known, partition_bytes, &checked_mesh_,
                         from_last ? &last_pieces_ : nullptr);
  // Producers serving FP8 first send their split blocks' partial amaxes; all of
  // them or none must (a share quantized and one not make no checkpoint).
  SplitAmaxExchange exchange(talk.ids().size());
  std::set<std::string> covered;
  auto mixed = [&]() {
    for (const auto& id : covered) {
      if (exchange.started() && !exchange.Has(id)) {
        return Status::InvalidArgument("producer " + id +
                                       " serves BF16 while others quantize to FP8 (SPLIT_AMAXES): "
                                       "give every producer the same serving description");
      }
    }
    return Status::Ok();
  };
  for (size_t got = 0; got < talk.ids().size();) {
    auto next = talk.Next("before reporting coverage");
    if (!next.ok()) return fail(next.status());
    auto& [id, message] = *next;
    if (auto type = PeekType(ByteSpan(*message)); type.ok() && *type == MessageType::kSplitAmaxes) {
      auto amaxes = ParseSplitAmaxes(ByteSpan(*message));
      if (!amaxes.ok()) return fail(amaxes.status().WithContext("from producer " + id));
      if (amaxes->refit_id != talk.refit_id()) continue;
      auto complete = exchange.Add(id, std::move(*amaxes), message->size());
      if (!complete.ok()) return fail(complete.status());
      if (Status s = mixed(); !s.ok()) return fail(s);
      if (*complete) {
        for (auto& [to, answer] : exchange.Answers(talk.refit_id()))
          hub_->Send(to, std::move(answer));
      }
      continue;
    }
    auto coverage = ParseCoverage(ByteSpan(*message));
    if (!coverage.ok()) return fail(WrongMessage(id, ByteSpan(*message), "COVERAGE"));
    if (coverage->refit_id != talk.refit_id()) continue;
    if (Status s = assembly.AddCoverage(id, std::move(*coverage)); !s.ok()) return fail(s);
    covered.insert(id);
    if (Status s = mixed(); !s.ok()) return fail(s);
    ++got;
  }
  report.fp8 = exchange.stats();
  report.coverage_seconds = SecondsSince<Clock>(start);
  if (Status s = assembly.SettleBase(); !s.ok()) return fail(s);
  report.base_from_producers = assembly.base_from_producers();
  const codec::Manifest& base = assembly.base();

  // 2. Base hashes out, mask contributions and base proofs back: the target.
  for (const auto& id : talk.ids()) {
    hub_->Send(id, EncodeBaseHashes(assembly.HashesFor(id, talk.refit_id())));
  }
  for (size_t got = 0; got < talk.ids().size();) {
    auto next = talk.Next("while encoding");
    if (!next.ok()) return fail(next.status());
    auto& [id, message] = *next;
    auto p = ParseProduced(ByteSpan(*message));
    if (!p.ok()) return fail(WrongMessage(id, ByteSpan(*message), "PRODUCED"));
    if (p->refit_id != talk.refit_id()) continue;
    assembly.AddProduced(id, std::move(*p));
    ++got;
  }
  if (Status s = assembly.SettleTarget(); !s.ok()) return fail(s);
  const codec::Manifest* target = &assembly.target();
  const std::map<std::string, Produced>& produced = assembly.produced();
  const std::vector<const ShareReport*> reports = assembly.reports();
  report.produce_seconds = SecondsSince<Clock>(start);
  uint64_t chunk_changes = 0;
  for (const auto& [id, p] : produced) {
    chunk_changes += p.changed_elements;
    ProducerSummary summary{id, assembly.share(id).coverage.size(), 0, 0, p.local_bytes, p.seconds};
    for (const auto& c : p.changes) (c.whole ? summary.whole_changes : summary.piece_changes)++;
    report.producers.push_back(summary);
  }
  log::Info(fmt::format("refit from {} producers: target {} known after {:.3f} s", produced.size(),
                        target->VersionId().ShortHex(), report.produce_seconds));

  // 3. Stream: cut-through under credit, pieces combined as they complete.
  auto stream = [&](const Source::ChunkMessageSink& sink, codec::DeltaStats* stats) -> Status {
    const double cpu = ThreadCpuSeconds();
    DeltaMerger merger(base, *target, chunk_bytes, sink);
    merger.ExpectPieces(reports);
    std::map<std::string, uint64_t> remaining, granted;
    uint64_t left = 0;
    for (const auto& [id, p] : produced) {
      remaining[id] = p.chunks + p.piece_messages;
      left += remaining[id];
      const uint64_t grant = std::min<uint64_t>(remaining[id], options_.producer_window);
      if (grant > 0) hub_->Send(id, EncodePull({talk.refit_id(), static_cast<uint32_t>(grant)}));
      granted[id] = grant;
    }
    while (left > 0) {
      ASSIGN_OR_RETURN(auto next, talk.Next("while streaming"));
      auto& [id, message] = next;
      const ByteSpan bytes(*message);
      auto type = PeekType(bytes);
      if (!type.ok() || (*type != MessageType::kShardChunk && *type != MessageType::kPieces) ||
          remaining[id] == 0) {
        return WrongMessage(id, bytes, "SHARD_CHUNK or PIECES");
      }
      if (*type == MessageType::kShardChunk) {
        ASSIGN_OR_RETURN(auto chunk, ParseShardChunk(bytes));
        if (chunk.first != talk.refit_id()) continue;
        Status added = merger.AddChunk(chunk.second);
        if (!added.ok()) return added.WithContext("chunk from producer " + id);
      } else {
        ASSIGN_OR_RETURN(auto pieces, ParsePieces(bytes));
        if (pieces.first != talk.refit_id()) continue;
        for (const auto& e : pieces.second) {
          Status added = merger.AddPiece(e.tensor, e.partition, e.piece, message);
          if (!added.ok()) return added.WithContext("piece from producer " + id);
        }
      }
      report.merged_bytes += bytes.size();
      --remaining[id];
      --left;
      // Keep `producer_window` messages of each producer in flight.
      if (granted[id] < produced.at(id).chunks + produced.at(id).piece_messages) {
        hub_->Send(id, EncodePull({talk.refit_id(), 1}));
        ++granted[id];
      }
    }
    Status finished = merger.Finish(chunk_changes, stats);
    report.merge_cpu_seconds = ThreadCpuSeconds() - cpu;
    return finished;
  };
  auto published = source_->PublishStream(base, *target, stream);
  if (!published.ok()) return fail(published.status());
  report.publish = std::move(*published);
  talk.EndAll(report.publish.committed, report.publish.abort_reason);
  if (report.publish.committed) {
    last_target_ = *target;
    last_pieces_ = assembly.ProofOfTarget();
  }
  return report;
}

}  // namespace deltacast::relay
