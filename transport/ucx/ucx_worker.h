// UcxWorker: one UCP context and worker configured programmatically (never from
// the user's UCX_* environment for the settings that matter), plus the wakeup
// machinery the progress thread blocks on: UCP's event fd (UCP_FEATURE_WAKEUP) and
// an eventfd other threads write to when they post work.
//
// Thread safety: created on any thread, then used by exactly one thread (the
// transport's progress thread; UCS_THREAD_MODE_SINGLE), except Wake(), which any
// thread may call. Destroy it on that thread or after it ended.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace deltacast::transport::ucx {

struct UcxWorkerConfig {
  std::string tls;          // UCX_TLS value; empty = UCX's default ("all")
  std::string net_devices;  // UCX_NET_DEVICES value; empty = the environment's, else all
  // Further UCP settings (name without the UCX_ prefix, value).
  std::vector<std::pair<std::string, std::string>> settings;
};

class UcxWorker {
 public:
  // kInvalidArgument when UCX rejects a setting, kUnavailable when it finds no
  // usable transport.
  static Result<std::unique_ptr<UcxWorker>> Create(const UcxWorkerConfig& config);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  // Whether this UCX build can move CUDA device memory (ucp_context_query).
  bool supports_cuda_memory() const { return supports_cuda_; }

  // Any thread: makes a Wait() in progress (or the next one) return.
  void Wake();

  // Progress thread: arms UCP's event fd and blocks until UCP has events, Wake()
  // was called, or `timeout_ms` passed (-1 = no limit). Returns at once when UCP
  // still has unprocessed events.
  void Wait(int timeout_ms);

 private:
  UcxWorker() = default;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;  // UCP's
  int wake_fd_ = -1;   // ours (eventfd)
  bool supports_cuda_ = false;
};

}  // namespace deltacast::transport::ucx
