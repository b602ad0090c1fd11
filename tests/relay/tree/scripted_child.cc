#include "tests/relay/tree/scripted_child.h"

#include "codec/chunk.h"
#include "tests/relay/intercept_transport.h"

namespace deltacast::test_util {
namespace {

// Often enough that triggers and drops land within a few ms of their cause.
constexpr std::chrono::milliseconds kTickPeriod{10};

}  // namespace

// Wraps the child's transport to count, on its latest link, the messages sent that
// the parent has not taken yet (on_sent not run): a link closed before the parent
// took a message withdraws it (inproc), and a child that drops "after PREPARED"
// must not lose its PREPARED that way.
class ScriptedChild::UntakenCounter : public InterceptTransport {
 public:
  explicit UntakenCounter(std::unique_ptr<transport::Transport> inner)
      : UntakenCounter(std::move(inner), std::make_shared<Latest>()) {}
  int64_t untaken() const {
    std::lock_guard lock(latest_->mu);
    return latest_->link ? latest_->link->count.load() : 0;
  }

 private:
  struct Latest {
    mutable std::mutex mu;
    std::shared_ptr<InterceptedLink> link;
  };
  UntakenCounter(std::unique_ptr<transport::Transport> inner, std::shared_ptr<Latest> latest)
      : InterceptTransport(std::move(inner), Hooks(latest)), latest_(std::move(latest)) {}
  static InterceptHooks Hooks(std::shared_ptr<Latest> latest) {
    InterceptHooks hooks;
    hooks.on_link = [latest](const std::shared_ptr<InterceptedLink>& link) {
      std::lock_guard lock(latest->mu);
      latest->link = link;
    };
    hooks.on_send = [](InterceptedLink& link, transport::Message&,
                       transport::SendHandler& on_sent) {
      ++link.count;
      on_sent = [link = link.shared_from_this(), on_sent = std::move(on_sent)](Status status) {
        --link->count;
        if (on_sent) on_sent(status);
      };
      return SendAction::kForward;
    };
    return hooks;
  }
  std::shared_ptr<Latest> latest_;
};

Result<std::unique_ptr<ScriptedChild>> ScriptedChild::Start(
    const topology::ClusterConfig& config, const std::string& id, std::string token,
    Digest128 active_version, std::unique_ptr<transport::Transport> transport, ChildScript script) {
  ASSIGN_OR_RETURN(topology::TreePlan plan, topology::PlanTree(config));
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    if (plan.nodes[i].id != id || !plan.nodes[i].parent) continue;
    return std::unique_ptr<ScriptedChild>(
        new ScriptedChild(config, std::move(plan), i, std::move(token), active_version,
                          std::move(transport), std::move(script)));
  }
  return Status::NotFound("no planned receiver '" + id + "'");
}

ScriptedChild::ScriptedChild(const topology::ClusterConfig& config, topology::TreePlan plan,
                             size_t self, std::string token, Digest128 active_version,
                             std::unique_ptr<transport::Transport> transport, ChildScript script)
    : config_(config),
      plan_(std::move(plan)),
      self_(plan_.nodes[self]),
      id_(self_.id),
      active_version_(active_version),
      script_(std::move(script)),
      counter_(new UntakenCounter(std::move(transport))),
      transport_(counter_),
      loop_([this] { Tick(); }, kTickPeriod, "scripted-child"),
      parent_(loop_, config_, self_, std::move(token), *transport_, LinkEvents()) {
  loop_.Start();
}

ScriptedChild::~ScriptedChild() { Stop(); }

void ScriptedChild::Stop() {
  if (stopped_.exchange(true)) return;
  transport_->Shutdown();
  loop_.Stop();
  parent_.Close();
}

ChildRecord ScriptedChild::record() const {
  std::lock_guard lock(mu_);
  return record_;
}

bool ScriptedChild::Wait(const std::function<bool(const ChildRecord&)>& done,
                         std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return changed_.wait_for(lock, timeout, [&] { return done(record_); });
}

void ScriptedChild::Update(const std::function<void(ChildRecord&)>& change) {
  {
    std::lock_guard lock(mu_);
    change(record_);
  }
  changed_.notify_all();
}

relay::ParentLink::Events ScriptedChild::LinkEvents() {
  relay::ParentLink::Events e;
  // What it holds: the active version only, no delta in flight, so a parent replays
  // a refit whole to it.
  e.hello = [this] {
    relay::Hello hello;
    hello.active_version = active_version_;
    return hello;
  };
  e.joined = [this] { Update([](ChildRecord& r) { ++r.joins; }); };
  // A link the parent drops is dialled again by the link itself, as a node's is.
  e.message = [this](relay::MessageType type, const transport::Message& message) {
    OnMessage(type, message);
  };
  return e;
}

void ScriptedChild::Tick() {
  if (stopped_) return;
  if (!dialing_) {
    const auto& trigger = record().joins == 0 ? script_.join_when : script_.rejoin_when;
    if (trigger && trigger()) dialing_ = true;
  }
  if (drop_due_ && counter_->untaken() == 0) {
    drop_due_ = false;
    DropLink();
  }
  if (dialing_) parent_.Tick(RuntimeClock::now(), /*between_refits=*/true);
  MaybePrepared();
}

void ScriptedChild::DropLink() {
  parent_.Close();
  dialing_ = false;
  Update([](ChildRecord& r) { r.dropped = true; });
}

void ScriptedChild::OnMessage(relay::MessageType type, const transport::Message& message) {
  if (!dialing_) return;  // dropped: what was in flight is lost with the link
  const ByteSpan bytes(*message);
  switch (type) {
    case relay::MessageType::kBegin:
      return OnBegin(bytes);
    case relay::MessageType::kChunk:
      return OnChunk(bytes);
    case relay::MessageType::kCommit:
    case relay::MessageType::kAbort:
      return OnDecision(type, bytes);
    case relay::MessageType::kActiveVersion: {
      auto told = relay::ParseActiveVersion(bytes);
      if (!told.ok()) return parent_.ProtocolError(told.status().message());
      return Update([&](ChildRecord& r) {
        ++r.versions_told;
        r.manifests_told += told->has_manifest ? 1 : 0;
      });
    }
    default:
      return;  // answers to requests this child never makes
  }
}

void ScriptedChild::OnBegin(ByteSpan bytes) {
  auto begin = relay::ParseBegin(bytes);
  if (!begin.ok()) return parent_.ProtocolError(begin.status().message());
  bool drop = false;
  Update([&](ChildRecord& r) {
    if (r.refit_id != begin->refit_id) {
      const ChildRecord before = r;
      r = ChildRecord{};
      r.joins = before.joins;
      r.versions_told = before.versions_told;
      r.manifests_told = before.manifests_told;
      r.dropped = before.dropped;
      r.refit_id = begin->refit_id;
    }
    ++r.begins;
    // A replayed BEGIN (after a rejoin): the parent waits for a new PREPARED.
    r.prepared_sent = false;
    drop = script_.drop_at == DropAt::kBegin && !r.dropped;
  });
  // The window, as a node grants it on every BEGIN.
  parent_.Send(relay::EncodeCredit({static_cast<uint32_t>(config_.tree.window), begin->refit_id}));
  if (drop) DropLink();
}

void ScriptedChild::OnChunk(ByteSpan bytes) {
  auto header = codec::PeekChunkHeader(relay::ChunkOf(bytes));
  if (!header.ok()) return parent_.ProtocolError(header.status().message());
  uint64_t refit_id = 0;
  bool fail = false, drop = false;
  Update([&](ChildRecord& r) {
    refit_id = r.refit_id;
    r.chunks.insert(header->sequence);
    if (header->kind == codec::ChunkKind::kEnd) r.end = header->sequence;
    fail = script_.stream == StreamAnswer::kFailed && !r.failed_sent;
    drop = script_.drop_at == DropAt::kFirstChunk && !r.dropped;
  });
  parent_.Send(relay::EncodeCredit({1, refit_id}));
  if (fail) SendFailed();
  if (drop) return DropLink();
  MaybePrepared();
}

void ScriptedChild::MaybePrepared() {
  if (!dialing_ || !parent_.joined() || script_.stream != StreamAnswer::kPrepared) return;
  const ChildRecord r = record();
  if (r.prepared_sent || r.failed_sent || r.decision || !r.AllChunks()) return;
  if (script_.prepare_when && !script_.prepare_when()) return;
  relay::Prepared prepared{r.refit_id, {relay::NodeReport{.node_id = id_}}};
  // Recorded before it goes: the parent may act on it before this thread goes on.
  Update([](ChildRecord& rec) { rec.prepared_sent = true; });
  parent_.Send(relay::EncodePrepared(prepared));
  if (script_.drop_at == DropAt::kPrepared && !r.dropped) drop_due_ = true;
}

void ScriptedChild::OnDecision(relay::MessageType type, ByteSpan bytes) {
  auto d = relay::ParseDecision(bytes);
  if (!d.ok()) return parent_.ProtocolError(d.status().message());
  const ChildRecord r = record();
  if (d->refit_id != r.refit_id) return;
  Update([&](ChildRecord& rec) { rec.decision = type; });
  // A node that failed while streaming cannot commit either: it says FAILED again.
  if (script_.decision == DecisionAnswer::kFailed ||
      (r.failed_sent && type == relay::MessageType::kCommit)) {
    return SendFailed();
  }
  const relay::MessageType outcome = type == relay::MessageType::kCommit
                                         ? relay::MessageType::kCommitted
                                         : relay::MessageType::kAborted;
  Update([](ChildRecord& rec) { rec.confirmed_sent = true; });
  parent_.Send(relay::EncodeOutcome(outcome, {d->refit_id, 1, {}}));
}

void ScriptedChild::SendFailed() {
  const uint64_t refit_id = record().refit_id;
  Update([](ChildRecord& rec) { rec.failed_sent = true; });
  parent_.Send(relay::EncodeFailed({refit_id, id_, script_.reason, relay::FailureKind::kNode}));
}

}  // namespace deltacast::test_util
