#include "transport/ucx/ucx_worker.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>

namespace deltacast::transport::ucx {
namespace {

struct ConfigDeleter {
  void operator()(ucp_config_t* config) const { ucp_config_release(config); }
};

Status Modify(ucp_config_t* config, const char* name, const std::string& value) {
  const ucs_status_t status = ucp_config_modify(config, name, value.c_str());
  if (status != UCS_OK) {
    return Status::InvalidArgument(std::string("ucx: setting ") + name + "=\"" + value +
                                   "\": " + ucs_status_string(status));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<UcxWorker>> UcxWorker::Create(const UcxWorkerConfig& config) {
  std::unique_ptr<UcxWorker> self(new UcxWorker());

  ucp_config_t* raw_config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &raw_config);
  if (status != UCS_OK) {
    return Status::Internal(std::string("ucx: ucp_config_read: ") + ucs_status_string(status));
  }
  std::unique_ptr<ucp_config_t, ConfigDeleter> ucp_config(raw_config);
  RETURN_IF_ERROR(Modify(ucp_config.get(), "TLS", config.tls.empty() ? "all" : config.tls));
  // Unset: UCX_NET_DEVICES from the environment applies (UCX's default: all).
  if (!config.net_devices.empty()) {
    RETURN_IF_ERROR(Modify(ucp_config.get(), "NET_DEVICES", config.net_devices));
  }
  // Shared memory has no error detection of its own: keepalive makes a dead peer
  // show up within a couple of seconds instead of the default 20 s.
  RETURN_IF_ERROR(Modify(ucp_config.get(), "KEEPALIVE_INTERVAL", "1s"));
  // Without it UCX 1.13 leaves the shared-memory transports out of endpoints that
  // ask for peer error handling (all of ours), and a "shm" link finds no lane.
  // (Only where a shared-memory transport is loaded; UCX warns about it otherwise.)
  const std::string& tls = config.tls;
  const bool shm = tls.empty() || tls.find("all") != std::string::npos ||
                   tls.find("sm") != std::string::npos || tls.find("mm") != std::string::npos ||
                   tls.find("posix") != std::string::npos || tls.find("sysv") != std::string::npos;
  if (shm) RETURN_IF_ERROR(Modify(ucp_config.get(), "MM_ERROR_HANDLING", "y"));
  for (const auto& [name, value] : config.settings) {
    RETURN_IF_ERROR(Modify(ucp_config.get(), name.c_str(), value));
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  status = ucp_init(&params, ucp_config.get(), &self->context_);
  if (status != UCS_OK) {
    return Status::Unavailable(std::string("ucx: ucp_init (TLS=") + config.tls +
                               "): " + ucs_status_string(status));
  }

  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(self->context_, &attr) == UCS_OK) {
    self->supports_cuda_ = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  status = ucp_worker_create(self->context_, &worker_params, &self->worker_);
  if (status != UCS_OK) {
    return Status::Unavailable(std::string("ucx: ucp_worker_create: ") + ucs_status_string(status));
  }
  status = ucp_worker_get_efd(self->worker_, &self->event_fd_);
  if (status != UCS_OK) {
    return Status::Unavailable(std::string("ucx: ucp_worker_get_efd: ") +
                               ucs_status_string(status));
  }
  self->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (self->wake_fd_ < 0) return Status::FromErrno(errno, "ucx: eventfd");
  return self;
}

UcxWorker::~UcxWorker() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void UcxWorker::Wake() {
  const uint64_t one = 1;
  // A full counter (EAGAIN) already means "wake up".
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
}

void UcxWorker::Wait(int timeout_ms) {
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;  // events already pending
  pollfd fds[2] = {{event_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  const int ready = poll(fds, 2, timeout_ms);
  if (ready > 0 && (fds[1].revents & POLLIN) != 0) {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t n = read(wake_fd_, &count, sizeof count);
  }
}

}  // namespace deltacast::transport::ucx
