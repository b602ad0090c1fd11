// Thread-safety contracts that clang checks (-Wthread-safety): which mutex guards a
// member, which functions expect it held or take it themselves. The clang build that
// scripts/fuzz configures compiles every engine source with the analysis and fails
// on a violation (cmake/ThreadSafety.cmake); under gcc the macros are empty.
//
// How to annotate (docs/architecture.md, "Threads"):
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_) = 0;          // read or written only with mu_ held
//   Buffer* buf_ PT_GUARDED_BY(mu_);         // the pointee is guarded, not the pointer
//   void BumpLocked() REQUIRES(mu_);          // the caller holds mu_
//   void Bump() EXCLUDES(mu_) { MutexLock lock(mu_); BumpLocked(); }
// A condition variable is a CondVar, waited on with the MutexLock that holds its
// mutex. A predicate lambda that reads guarded state says so: [&]() REQUIRES(mu_) {..}.
// NO_THREAD_SAFETY_ANALYSIS switches the check off for one function; use it only
// where the locking cannot be expressed, with a comment saying why.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define DELTACAST_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define DELTACAST_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) DELTACAST_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY DELTACAST_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) DELTACAST_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) DELTACAST_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) DELTACAST_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) DELTACAST_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) DELTACAST_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) DELTACAST_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) DELTACAST_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) DELTACAST_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) DELTACAST_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) DELTACAST_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) DELTACAST_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) DELTACAST_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) DELTACAST_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) DELTACAST_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) DELTACAST_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS DELTACAST_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace deltacast {

// std::mutex with the annotations libstdc++ leaves out. lock()/unlock() keep the
// standard names so std::scoped_lock and std::condition_variable_any still work.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds the mutex where it cannot see it (a callback
  // that the owner runs under its lock). Checks nothing at run time.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope (std::lock_guard); Unlock()/Lock() release it and take
// it back in the middle (std::unique_lock's unlock()/lock()).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  // Takes over a mutex the caller locked (if (!mu.try_lock()) ...; MutexLock lock(mu,
  // std::adopt_lock)).
  MutexLock(Mutex& mu, std::adopt_lock_t) REQUIRES(mu) : mu_(mu) {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  ~MutexLock() RELEASE() {
    if (held_) mu_.unlock();
  }

  void Unlock() RELEASE() {
    mu_.unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_.lock();
    held_ = true;
  }

 private:
  friend class CondVar;
  Mutex& mu_;
  bool held_ = true;
};

// std::shared_mutex, annotated: lock() for the one writer, lock_shared() for readers.
class CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  void lock_shared() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void unlock_shared() RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a SharedMutex exclusively for its scope.
class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;
  ~WriterMutexLock() RELEASE() { mu_.unlock(); }

 private:
  SharedMutex& mu_;
};

// Holds a SharedMutex shared for its scope.
class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex& mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_.lock_shared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;
  ~ReaderMutexLock() RELEASE() { mu_.unlock_shared(); }

 private:
  SharedMutex& mu_;
};

// std::condition_variable waited on through a MutexLock. The analysis cannot see
// that a wait releases and retakes the mutex; it sees the lock held throughout,
// which is what the caller's code after the wait may assume.
class CondVar {
 public:
  void notify_one() noexcept { cv_.notify_one(); }
  void notify_all() noexcept { cv_.notify_all(); }

  void wait(MutexLock& lock) {
    Adopted native(lock);
    cv_.wait(native.lock);
  }
  template <typename Pred>
  void wait(MutexLock& lock, Pred done) {
    Adopted native(lock);
    cv_.wait(native.lock, std::move(done));
  }
  template <typename Rep, typename Period>
  std::cv_status wait_for(MutexLock& lock, std::chrono::duration<Rep, Period> timeout) {
    Adopted native(lock);
    return cv_.wait_for(native.lock, timeout);
  }
  template <typename Rep, typename Period, typename Pred>
  bool wait_for(MutexLock& lock, std::chrono::duration<Rep, Period> timeout, Pred done) {
    Adopted native(lock);
    return cv_.wait_for(native.lock, timeout, std::move(done));
  }
  template <typename Clock, typename Duration>
  std::cv_status wait_until(MutexLock& lock, std::chrono::time_point<Clock, Duration> deadline) {
    Adopted native(lock);
    return cv_.wait_until(native.lock, deadline);
  }
  template <typename Clock, typename Duration, typename Pred>
  bool wait_until(MutexLock& lock, std::chrono::time_point<Clock, Duration> deadline, Pred done) {
    Adopted native(lock);
    return cv_.wait_until(native.lock, deadline, std::move(done));
  }

 private:
  // The MutexLock keeps owning the mutex: the std::unique_lock borrows it for the
  // wait and gives it back (locked) even if the predicate throws.
  struct Adopted {
    explicit Adopted(MutexLock& held) : lock(held.mu_.mu_, std::adopt_lock) {}
    ~Adopted() { lock.release(); }
    std::unique_lock<std::mutex> lock;
  };
  std::condition_variable cv_;
};

}  // namespace deltacast
