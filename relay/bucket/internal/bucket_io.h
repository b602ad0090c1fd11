// BucketIo: the S3 requests of a bucket bridge half, run on a worker pool so the
// bridge's event loop never blocks on the network, and the half's stats. Writes are
// retried with backoff until they succeed or the bridge stops (every object has one
// possible body, so a retry is harmless: docs/object-store.md, "Idempotent writes").
//
// Thread safety: every method may be called from any thread; `done` callbacks run
// on the loop they are given.
#pragma once

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/event_loop.h"
#include "common/log.h"
#include "common/parallel.h"
#include "common/thread_annotations.h"
#include "objstore/s3_client.h"
#include "relay/bucket/bucket_bridge.h"
#include "topology/stripe_plan.h"
#include "transport/transport.h"

namespace deltacast::relay::internal {

std::vector<std::byte> ToBytes(const std::string& s);

// The striped plan a bridge half (`half`: "bucket uplink", "bucket downlink") runs
// under: refused, naming the problem, if its node is not one of [objstore] bridges,
// a stripe's tree cannot be bridged, or a stripe's tree lacks the node.
Result<topology::StripedPlan> PlanBridgeHalf(const BucketBridgeOptions& options,
                                             std::string_view half);

class BucketIo {
 public:
  // `stopped` must outlive this object. `who` names the half in logs ("bucket
  // uplink bucket-eu").
  BucketIo(std::unique_ptr<objstore::S3Client> client, size_t threads,
           const std::atomic<bool>& stopped, std::string who)
      : client_(std::move(client)),
        stopped_(stopped),
        who_(std::move(who)),
        pool_(std::max<size_t>(threads, 1)) {}

  objstore::S3Client& client() { return *client_; }
  const std::string& who() const { return who_; }

  // The stats, with the client's request counts.
  BucketBridgeStats Stats() const;
  // Runs `update(stats)` under the stats' lock.
  template <class F>
  void Count(F&& update) {
    MutexLock lock(mu_);
    update(stats_);
  }
  // Counts an object that failed its checks; logs one in 20.
  void BadObject(const std::string& key, const std::string& why);
  // At the end of refit `refit_id` here: the requests since the last end (idle polls
  // before this refit included) become stats().last_refit_requests and a log line
  // "<who>: refit <id>: requests get=... total=N seconds=S" (bench/regions_report.py
  // reads it).
  void EndRefit(uint64_t refit_id);
  void Stop() { pool_.Stop(); }
  void Run(std::function<void()> task) { pool_.Post(std::move(task)); }

  // PUTs `body` as `key` until it is stored, then posts `done` (may be empty) to
  // `loop`. Gives up silently once the bridge stops.
  void Put(std::string key, transport::Message body, std::function<void()> done, EventLoop* loop) {
    pool_.Post([this, key = std::move(key), body = std::move(body), done = std::move(done), loop] {
      if (!PutNow(key, *body)) return;
      if (done && loop) loop->Post(done);
    });
  }
  // Blocking, on the calling (pool) thread: true once stored, false if stopped.
  bool PutNow(const std::string& key, const std::vector<std::byte>& body) {
    for (int attempt = 0;; ++attempt) {
      if (stopped_) return false;
      Status s = client_->Put(key, body);
      if (s.ok()) break;
      Retried(s, attempt);
    }
    MutexLock lock(mu_);
    ++stats_.objects_written;
    stats_.bytes_written += body.size();
    return true;
  }
  void Delete(std::string key) {
    pool_.Post([this, key = std::move(key)] {
      if (!stopped_) (void)client_->Delete(key);
    });
  }
  // Every object under `folder` (a best effort: what is left is dropped next time).
  void DeleteFolder(std::string folder) {
    pool_.Post([this, folder = std::move(folder)] {
      if (stopped_) return;
      auto list = client_->List(folder);
      if (!list.ok()) return;
      for (const auto& o : *list) {
        if (stopped_) return;
        (void)client_->Delete(o.key);
      }
    });
  }
  // Blocking: the object, nullopt when it is not there. Any other failure counts
  // as a retry and reads as not there yet (the caller polls again).
  std::optional<std::vector<std::byte>> GetIfThere(const std::string& key) {
    auto got = client_->Get(key);
    if (got.ok()) {
      MutexLock lock(mu_);
      ++stats_.objects_read;
      stats_.bytes_read += got->size();
      return std::move(*got);
    }
    if (got.status().code() != StatusCode::kNotFound) Retried(got.status(), 0);
    return std::nullopt;
  }
  // Blocking: like GetIfThere, but a failure other than 404 (the server away, a
  // read that raced an overwrite) is tried again, up to `attempts` times: for
  // answers a node waits on, where "not there" would fail its request.
  std::optional<std::vector<std::byte>> GetRetrying(const std::string& key, int attempts = 10) {
    for (int attempt = 0;; ++attempt) {
      auto got = client_->Get(key);
      if (got.ok()) {
        MutexLock lock(mu_);
        ++stats_.objects_read;
        stats_.bytes_read += got->size();
        return std::move(*got);
      }
      if (got.status().code() == StatusCode::kNotFound || attempt + 1 >= attempts || stopped_) {
        return std::nullopt;
      }
      Retried(got.status(), attempt);
    }
  }
  // Counts a failed request and sleeps a backoff of `attempt` (50 ms doubling to 1 s).
  void Retried(const Status& why, int attempt) {
    uint64_t n = 0;
    {
      MutexLock lock(mu_);
      n = stats_.retries++;
    }
    if (n % 50 == 0) log::Warn(fmt::format("bucket: {} (retrying)", why.ToString()));
    if (attempt > 0 || why.code() != StatusCode::kNotFound) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::min(1000, 50 << std::min(attempt, 5))));
    }
  }

 private:
  std::unique_ptr<objstore::S3Client> client_;
  const std::atomic<bool>& stopped_;
  const std::string who_;
  mutable Mutex mu_;
  BucketBridgeStats stats_ GUARDED_BY(mu_);
  objstore::RequestCounts at_last_end_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_end_ GUARDED_BY(mu_) =
      std::chrono::steady_clock::now();
  WorkerPool pool_;
};

}  // namespace deltacast::relay::internal
