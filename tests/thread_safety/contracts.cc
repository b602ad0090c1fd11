// Compiled (never run) by tests/thread_safety/check.sh under clang with the flags of
// the thread-safety check (cmake/ThreadSafety.cmake): as written it must compile;
// with -DVIOLATION=n it breaks one contract and must fail to compile, naming it.
#include <cstddef>
#include <deque>

#include "common/thread_annotations.h"

namespace deltacast {

class Queue {
 public:
  void Push(int value) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    PushLocked(value);
    ready_.notify_one();
  }

  int Pop() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ready_.wait(lock, [&]() REQUIRES(mu_) { return !items_.empty(); });
    const int value = items_.front();
    items_.pop_front();
    return value;
  }

  size_t size() const EXCLUDES(mu_) {
#if VIOLATION == 1  // reads a guarded member without the lock
    return items_.size();
#else
    MutexLock lock(mu_);
    return items_.size();
#endif
  }

  void PushTwice(int value) EXCLUDES(mu_) {
#if VIOLATION == 2  // calls a REQUIRES helper without the lock
    PushLocked(value);
    PushLocked(value);
#else
    MutexLock lock(mu_);
    PushLocked(value);
    PushLocked(value);
#endif
  }

  int PopWhenTwo() EXCLUDES(mu_) {
    MutexLock lock(mu_);
#if VIOLATION == 3  // a wait predicate that does not say it runs under the lock
    ready_.wait(lock, [&] { return items_.size() >= 2; });
#else
    ready_.wait(lock, [&]() REQUIRES(mu_) { return items_.size() >= 2; });
#endif
    const int value = items_.front();
    items_.pop_front();
    return value;
  }

  // Releases the lock in the middle, like a worker running a task.
  int DrainOne() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (items_.empty()) return 0;
    const int value = items_.front();
    lock.Unlock();
#if VIOLATION == 4  // touches guarded state after Unlock
    items_.pop_front();
#endif
    lock.Lock();
    items_.pop_front();
    return value;
  }

 private:
  void PushLocked(int value) REQUIRES(mu_) { items_.push_back(value); }

  mutable Mutex mu_;
  CondVar ready_;
  std::deque<int> items_ GUARDED_BY(mu_);
};

// Readers share, the writer excludes them.
class Names {
 public:
  size_t count() EXCLUDES(mu_) {
    ReaderMutexLock lock(mu_);
    return count_;
  }
  void Add() EXCLUDES(mu_) {
#if VIOLATION == 5  // writes under a shared (reader) lock
    ReaderMutexLock lock(mu_);
#else
    WriterMutexLock lock(mu_);
#endif
    ++count_;
  }

 private:
  SharedMutex mu_;
  size_t count_ GUARDED_BY(mu_) = 0;
};

// Instantiated so the templates' bodies are analysed too.
int Use(Queue& queue, Names& names) {
  queue.Push(1);
  queue.PushTwice(2);
  names.Add();
  return queue.Pop() + queue.PopWhenTwo() + queue.DrainOne() + static_cast<int>(queue.size()) +
         static_cast<int>(names.count());
}

}  // namespace deltacast
