#include "relay/bucket/bucket_requests.h"

#include <fmt/core.h>

#include "common/log.h"

namespace deltacast::relay {
namespace {

// The answer a request gets from the source.
MessageType AnswerType(MessageType request) {
  return request == MessageType::kFetch ? MessageType::kPartition : MessageType::kManifest;
}

// Whether `bytes` is a well-formed FETCH or FETCH_MANIFEST.
bool IsRequest(ByteSpan bytes, MessageType* type) {
  auto t = PeekType(bytes);
  if (!t.ok()) return false;
  *type = *t;
  if (*t == MessageType::kFetch) return ParseFetch(bytes).ok();
  if (*t == MessageType::kFetchManifest) return ParseFetchManifest(bytes).ok();
  return false;
}

// Every request id under `folder` (keys that do not end in one are skipped).
std::vector<uint64_t> ListIds(internal::BucketIo& io, const std::string& folder) {
  std::vector<uint64_t> ids;
  auto list = io.client().List(folder);
  if (!list.ok()) return ids;  // the next poll asks again
  for (const auto& o : *list) {
    if (auto id = objstore::BucketLayout::RequestIdOf(o.key); id.ok()) ids.push_back(*id);
  }
  return ids;
}

}  // namespace

// ---- downlink ------------------------------------------------------------------------

BucketRequestsDown::BucketRequestsDown(internal::BucketIo& io, const objstore::BucketLayout& layout,
                                       EventLoop& loop, Downstream& downstream,
                                       const BucketBridgeOptions& options)
    : io_(io),
      layout_(layout),
      loop_(loop),
      downstream_(downstream),
      who_(io.who()),
      timeout_(options.request_timeout),
      backoff_(options.poll, options.poll_max) {}

void BucketRequestsDown::NotFound(const std::string& child, MessageType type,
                                  uint64_t child_request) {
  downstream_.SendTo(child, transport::MakeMessage(type == MessageType::kFetch
                                                       ? EncodePartition(child_request, false, {})
                                                       : EncodeManifest(child_request, false, {})));
}

void BucketRequestsDown::Submit(const std::string& child, MessageType type, ByteSpan bytes) {
  const uint64_t child_request = RequestIdOf(bytes);
  if (pending_.size() >= kMaxRequests) {
    io_.Count([](BucketBridgeStats& s) { ++s.requests_refused; });
    return NotFound(child, type, child_request);
  }
  // Random, so a restarted downlink never takes an old answer left in the bucket
  // for one of its own.
  uint64_t id = 0;
  while (id == 0 || pending_.contains(id)) id = ids_();
  const auto now = Clock::now();
  pending_[id] = Pending{child, child_request, type, now + timeout_};
  io_.Count([](BucketBridgeStats& s) { ++s.requests_up; });
  io_.Put(
      layout_.Request(id), transport::MakeMessage(WithRequestId(bytes, id)),
      [this] { backoff_.Reset(Clock::now()); }, &loop_);
  backoff_.Reset(now);
}

void BucketRequestsDown::Tick(Clock::time_point now) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (now < it->second.deadline) {
      ++it;
      continue;
    }
    const Pending& p = it->second;
    log::Warn(fmt::format(
        "{}: no answer from the source through the bucket to {}'s {} within {} ms; answered "
        "\"not found\"",
        who_, p.child, p.type == MessageType::kFetch ? "FETCH" : "FETCH_MANIFEST",
        timeout_.count()));
    io_.Count([](BucketBridgeStats& s) { ++s.requests_timed_out; });
    NotFound(p.child, p.type, p.child_request);
    io_.Delete(layout_.Request(it->first));  // a late answer is deleted as stale
    it = pending_.erase(it);
  }
  if (pending_.empty() || listing_ || now < next_poll_) return;
  listing_ = true;
  next_poll_ = now + backoff_.Next(now);
  // One LIST for every request outstanding, then a GET per answer there.
  io_.Run([this] {
    auto ids = ListIds(io_, layout_.AnswersFolder());
    loop_.Post([this, ids = std::move(ids)]() mutable { OnList(std::move(ids)); });
  });
}

void BucketRequestsDown::OnList(std::vector<uint64_t> ids) {
  listing_ = false;
  for (uint64_t id : ids) {
    if (reading_.contains(id)) continue;
    if (!pending_.contains(id)) {
      // Timed out here, or left by an earlier downlink: nobody waits for it.
      io_.Delete(layout_.Answer(id));
      continue;
    }
    reading_.insert(id);
    io_.Run([this, id] {
      auto got = io_.GetRetrying(layout_.Answer(id), 3);
      loop_.Post([this, id, got = std::move(got)]() mutable { OnAnswer(id, std::move(got)); });
    });
  }
}

void BucketRequestsDown::OnAnswer(uint64_t id, std::optional<std::vector<std::byte>> bytes) {
  reading_.erase(id);
  auto it = pending_.find(id);
  if (it == pending_.end()) {
    if (bytes) io_.Delete(layout_.Answer(id));
    return;
  }
  if (!bytes) return;  // listed but not readable: the next poll asks again
  const Pending p = it->second;
  pending_.erase(it);
  backoff_.Reset(Clock::now());
  auto type = PeekType(*bytes);
  Status valid = type.ok() ? Status::Ok() : type.status();
  if (valid.ok() && *type != AnswerType(p.type)) valid = Status::Corrupt("not the request's type");
  if (valid.ok() && RequestIdOf(*bytes) != id) valid = Status::Corrupt("names another request");
  if (valid.ok()) {
    valid = (*type == MessageType::kPartition ? ParsePartition(*bytes) : ParseManifest(*bytes))
                .status();
  }
  if (!valid.ok()) {
    // Nobody writes this answer again: "not found" now, and the child may ask again.
    io_.BadObject(layout_.Answer(id), valid.ToString());
    io_.Delete(layout_.Answer(id));
    return NotFound(p.child, p.type, p.child_request);
  }
  io_.Count([](BucketBridgeStats& s) { ++s.answers; });
  io_.Delete(layout_.Answer(id));
  downstream_.SendTo(p.child, transport::MakeMessage(WithRequestId(*bytes, p.child_request)));
}

// ---- uplink ---------------------------------------------------------------------------

BucketRequestsUp::BucketRequestsUp(internal::BucketIo& io, const objstore::BucketLayout& layout,
                                   EventLoop& loop, ParentLink& parent,
                                   const BucketBridgeOptions& options)
    : io_(io),
      layout_(layout),
      loop_(loop),
      parent_(parent),
      backoff_(options.poll, options.poll_max) {}

void BucketRequestsUp::Tick(Clock::time_point now, bool active) {
  if (!active || !parent_.joined() || listing_ || now < next_poll_) return;
  listing_ = true;
  next_poll_ = now + backoff_.Next(now);
  io_.Run([this] {
    auto ids = ListIds(io_, layout_.RequestsFolder());
    loop_.Post([this, ids = std::move(ids)]() mutable { OnList(std::move(ids)); });
  });
}

void BucketRequestsUp::OnList(std::vector<uint64_t> ids) {
  listing_ = false;
  for (uint64_t id : ids) {
    if (taken_.contains(id) || taken_.size() >= kMaxForwarded) continue;
    taken_[id] = 0;
    io_.Run([this, id] {
      auto got = io_.GetRetrying(layout_.Request(id), 3);
      loop_.Post([this, id, got = std::move(got)]() mutable { OnRequest(id, std::move(got)); });
    });
  }
}

void BucketRequestsUp::OnRequest(uint64_t id, std::optional<std::vector<std::byte>> bytes) {
  if (!bytes || !parent_.joined()) {
    taken_.erase(id);  // gone (timed out below), or no link: the next LIST decides
    return;
  }
  MessageType type{};
  if (!IsRequest(*bytes, &type) || RequestIdOf(*bytes) != id) {
    io_.BadObject(layout_.Request(id), "not a FETCH or FETCH_MANIFEST of its id");
    io_.Delete(layout_.Request(id));
    taken_.erase(id);
    return;
  }
  // Renumbered on the tree link, as a relay routes a child's request up.
  const uint64_t up = next_up_++;
  taken_[id] = up;
  up_[up] = id;
  backoff_.Reset(Clock::now());
  io_.Count([](BucketBridgeStats& s) { ++s.requests_up; });
  parent_.Send(WithRequestId(*bytes, up));
}

bool BucketRequestsUp::OnAnswer(ByteSpan message) {
  auto it = up_.find(RequestIdOf(message));
  if (it == up_.end()) return false;
  const uint64_t id = it->second;
  up_.erase(it);
  taken_[id] = 0;  // not forwarded again while its answer is written
  io_.Count([](BucketBridgeStats& s) { ++s.answers; });
  auto body = transport::MakeMessage(WithRequestId(message, id));
  // The request goes only once the answer is stored: a lost write is forwarded again.
  io_.Run([this, id, body] {
    const bool stored = io_.PutNow(layout_.Answer(id), *body);
    if (stored) (void)io_.client().Delete(layout_.Request(id));
    loop_.Post([this, id] { taken_.erase(id); });
  });
  return true;
}

void BucketRequestsUp::LinkLost() {
  for (const auto& [up, id] : up_) taken_.erase(id);
  up_.clear();
}

}  // namespace deltacast::relay
