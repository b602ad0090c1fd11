// WriteBack: flushes a node's store after a commit, on a thread of its own, so the
// O(model) disk writes of a refit are never on its critical path (docs/recovery.md,
// "Durability"). The version is durable before this runs: by the delta's chunks in
// the node's spool and the decision; the journal notes the store as unflushed until
// the flush completes (apply::Replica::MarkFlushed).
//
// One flush at a time. The next refit waits for it (Join) before writing: a write
// over a page whose write-back is still running could leave on disk a mix that the
// journal no longer describes.
//
// Under a simulated runtime (common/runtime.h) the flush is a timer of the runtime
// instead of a thread, and Join runs it inline if it has not run.
//
// Thread safety: Start, Join and Abandon from one thread (the node's apply thread);
// `done` runs on the flushing thread.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <thread>

#include "apply/weight_store.h"
#include "common/hash.h"
#include "common/runtime.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace deltacast::relay {

class WriteBack {
 public:
  struct Outcome {
    Digest128 target;  // the commit it flushed
    Status status;
    double seconds = 0;  // flushing, not counting the delay
  };

  // Flushes start `delay` after Start (0: at once). A delay lets a burst of refits
  // coalesce pages the kernel has not written yet; tests use a long one to keep a
  // commit's pages unflushed, as a machine crash would find them.
  explicit WriteBack(std::chrono::milliseconds delay);
  ~WriteBack();  // Abandon()
  WriteBack(const WriteBack&) = delete;
  WriteBack& operator=(const WriteBack&) = delete;

  // Flushes `store` (which must outlive the flush) for the commit of `target`, then
  // calls `done`. Joins an earlier flush first.
  void Start(apply::WeightStore& store, const Digest128& target, std::function<void()> done);
  // Starts the flush now if it is still waiting out the delay, waits for it, and
  // returns its outcome; nullopt if there was none since the last Join.
  std::optional<Outcome> Join();
  // Drops a flush still waiting out its delay (the journal still notes the store as
  // unflushed, so the next start reconciles it); runs one that is due, waits for
  // one that has started, and returns its outcome.
  std::optional<Outcome> Abandon();

 private:
  const std::chrono::milliseconds delay_;
  Mutex mu_;
  CondVar wake_;
  bool hurry_ GUARDED_BY(mu_) = false;      // start now
  bool abandoned_ GUARDED_BY(mu_) = false;  // do not start at all
  bool started_ GUARDED_BY(mu_) = false;
  std::optional<Outcome> outcome_ GUARDED_BY(mu_);
  std::thread thread_;
  // Simulated: the flush waiting for its timer (or Join), and the runtime's queue.
  std::function<void()> sim_flush_;
  Runtime* sim_ = nullptr;
  uint64_t queue_ = 0;
};

}  // namespace deltacast::relay
