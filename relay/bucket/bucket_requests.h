// The request channel of a bucket bridge (docs/object-store.md, "Requests through
// the bucket"): a region node's FETCH (repair of a torn partition, catch-up by
// partitions) and FETCH_MANIFEST travel up as objects, and the source's answers
// (PARTITION, MANIFEST; "not found" is an answer too) come back as objects.
//
// BucketRequestsDown (downlink): writes each child's request as `requests/<id>`
// under a fresh random id, polls `answers/` while any is outstanding, passes each
// answer to the child that asked (renumbered back to its request id, as UpRequests
// does) and deletes it. Bounded: at most kMaxRequests in flight, each answered "not
// found" after `timeout` (the child asks again or fails clearly).
//
// BucketRequestsUp (uplink): while a refit runs at the source (only then does it
// hold the partition bytes and manifests), LISTs `requests/`, sends each up its tree
// link as a relay routes a child's request, writes the answer as `answers/<id>` and
// then deletes the request.
//
// The bucket is not trusted: an answer must be of the request's type and name its
// id, and the node that asked checks a PARTITION's bytes by hash as in the tree.
//
// Thread safety: the owning half's loop thread only (S3 requests run on its pool).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/event_loop.h"
#include "objstore/bucket_layout.h"
#include "relay/bucket/internal/bucket_io.h"
#include "relay/bucket/internal/poll_backoff.h"
#include "relay/tree/downstream.h"
#include "relay/tree/parent_link.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {

class BucketRequestsDown {
 public:
  using Clock = std::chrono::steady_clock;
  // Requests outstanding at most; beyond, a child's is answered "not found" at once
  // (as UpRequests::kMaxRoutedRequests bounds a relay's).
  static constexpr size_t kMaxRequests = 1024;

  // Every reference must outlive this object.
  BucketRequestsDown(internal::BucketIo& io, const objstore::BucketLayout& layout, EventLoop& loop,
                     Downstream& downstream, const BucketBridgeOptions& options);

  // A child's FETCH or FETCH_MANIFEST (already parsed once by the caller).
  void Submit(const std::string& child, MessageType type, ByteSpan bytes);
  // Times requests out and polls for answers while any is outstanding.
  void Tick(Clock::time_point now);
  size_t in_flight() const { return pending_.size(); }

 private:
  struct Pending {
    std::string child;
    uint64_t child_request = 0;
    MessageType type = MessageType::kFetch;
    Clock::time_point deadline;
  };
  void NotFound(const std::string& child, MessageType type, uint64_t child_request);
  void OnList(std::vector<uint64_t> ids);
  void OnAnswer(uint64_t id, std::optional<std::vector<std::byte>> bytes);

  internal::BucketIo& io_;
  const objstore::BucketLayout& layout_;
  EventLoop& loop_;
  Downstream& downstream_;
  const std::string who_;
  const std::chrono::milliseconds timeout_;
  std::map<uint64_t, Pending> pending_;  // by bucket request id
  std::set<uint64_t> reading_;           // answer GETs in flight
  std::mt19937_64 ids_{std::random_device{}()};
  internal::PollBackoff backoff_;  // news: a request written or an answer read
  bool listing_ = false;
  Clock::time_point next_poll_ = Clock::now();
};

class BucketRequestsUp {
 public:
  using Clock = std::chrono::steady_clock;
  // Requests forwarded to the source and not yet answered, at most.
  static constexpr size_t kMaxForwarded = 1024;

  BucketRequestsUp(internal::BucketIo& io, const objstore::BucketLayout& layout, EventLoop& loop,
                   ParentLink& parent, const BucketBridgeOptions& options);

  // `active`: a refit runs at the source, which answers only then.
  void Tick(Clock::time_point now, bool active);
  // A PARTITION / MANIFEST from the source: true when it answers a bucket request.
  bool OnAnswer(ByteSpan message);
  // The tree link dropped: its answers are lost; the requests are still in the
  // bucket and are forwarded again on the next link.
  void LinkLost();

 private:
  void OnList(std::vector<uint64_t> ids);
  void OnRequest(uint64_t id, std::optional<std::vector<std::byte>> bytes);

  internal::BucketIo& io_;
  const objstore::BucketLayout& layout_;
  EventLoop& loop_;
  ParentLink& parent_;
  // Bucket request id -> the id it carries up the tree link (0: being read, or its
  // answer being written).
  std::map<uint64_t, uint64_t> taken_;
  std::map<uint64_t, uint64_t> up_;  // tree request id -> bucket request id
  uint64_t next_up_ = 1;
  internal::PollBackoff backoff_;  // news: a request came
  bool listing_ = false;
  Clock::time_point next_poll_ = Clock::now();
};

}  // namespace deltacast::relay
