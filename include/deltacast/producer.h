// Many producers on the trainer (docs/producers.md): each Producer owns a disjoint
// set of the model's tensors (a trainer rank's part of the parameters) and encodes
// their changes itself; the Root is the source of the relay tree, waits for its
// producers, merges their chunk streams into one delta, combines their partition
// hashes into the version's manifest and runs the two-phase commit. No producer
// ever needs another's bytes, and the root never holds the model.
//
// One refit: Root::Publish on the root's thread while every producer calls Serve
// with its tensors' previous and new values. A producer that dies or fails mid-refit
// aborts it cleanly everywhere; the next refit needs every producer back.
//
// Thread safety: Producer::Serve and Root::Publish block the calling thread, one
// call at a time per object; Close and Stop may be called from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "deltacast/config.h"
#include "deltacast/source.h"
#include "deltacast/status.h"
#include "deltacast/tensor.h"

namespace deltacast {

struct ProducerOptions {
  std::string token;  // the cluster's shared secret
  // Unique among the root's producers, e.g. "rank-3"; where [security] encrypts
  // producer links (docs/producers.md, "TLS on producer links") also the name of its
  // certificate ({node} in [security] cert and key) and the CN the root checks.
  std::string id;
  // The root's producer listener, "host:port"; empty: the config's source host,
  // its port + 1000 (what RootOptions::producer_address defaults to).
  std::string root_address;
  bool context_mode = false;  // the context coder: fewer bytes, more encode CPU
  size_t encode_threads = 0;  // 0 = all cores
};

struct ProduceReport {
  bool committed = false;
  std::string reason;  // why not, when not committed
  uint64_t refit_id = 0;
  uint64_t partitions = 0;  // canonical partitions its tensors touch
  uint64_t changed_elements = 0;
  uint64_t sent_bytes = 0;  // to the root
  double encode_seconds = 0;
  double seconds = 0;  // the root's PRODUCE to the refit's end
};

class Producer {
 public:
  // Dials the root and joins it (retrying for a few connect timeouts), over TLS where
  // [security] encrypts producer links. kFailedPrecondition with the root's reason
  // when it refuses this producer (a certificate that is not this id's, no TLS where
  // it is required), or when TLS is required and [security] names no certificates;
  // kPermissionDenied when the root's certificate is not the source's. `model` lists
  // every tensor of the model the root publishes (names, dtypes, shapes: the
  // canonical table); this producer's tensors are named among them.
  static Result<std::unique_ptr<Producer>> Connect(const Config& config, ProducerOptions options,
                                                   std::vector<TensorSpec> model);
  ~Producer();
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  // Serves the root's next refit: `base` holds this producer's tensors as the
  // receivers have them, `target` their new values; the same tensors in both, each
  // in `model`. The bytes are only read and need to live until the call returns.
  // kInvalidArgument naming the tensor when they do not match; otherwise the report
  // says whether the version committed.
  Result<ProduceReport> Serve(const std::vector<TensorView>& base,
                              const std::vector<TensorView>& target);

  // Serve for tensors in the memory of CUDA device `device` (both versions there;
  // `bytes` are device addresses): they are compared and hashed on the GPU and only
  // their changed positions and XOR words cross to the host for entropy coding.
  // device = -1 runs the same path over host memory. kUnavailable without CUDA or
  // that device. The tensors are read only after the work queued on the trainer's
  // CUDA stream `stream` (a cudaStream_t as an integer, 1 = the legacy default
  // stream; 0 = after the whole device is idle) and must not be written until the
  // call returns. Addresses must be aligned to their element size.
  Result<ProduceReport> ServeFromGpu(int device, const std::vector<TensorView>& base,
                                     const std::vector<TensorView>& target, uintptr_t stream = 0);
  void Close();  // a Serve in progress returns kAborted

  struct Impl;

 private:
  explicit Producer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct RootOptions {
  std::string token;
  std::filesystem::path state_dir;  // as SourceOptions::state_dir
  size_t keep_deltas = 4;
  size_t producers = 1;  // how many producers make each version
  // Where producers dial, "host:port" (port 0: any, see producer_address()); empty:
  // the config's source host, its port + 1000.
  std::string producer_address;
};

class Root {
 public:
  // Listens for the tree on the config's source address and for producers.
  static Result<std::unique_ptr<Root>> Start(const Config& config, RootOptions options);
  ~Root();  // Stop()
  Root(const Root&) = delete;
  Root& operator=(const Root&) = delete;

  // One version from the producers' shares: waits for them to join, runs the refit,
  // returns its report. Fails without touching the tree when a producer does not
  // join, fails before the version's target is known, or the shares do not cover
  // the model exactly (the message names the tensor); a producer lost while
  // streaming aborts the version (committed false, the reason names it).
  Result<PublishReport> Publish();

  std::string producer_address() const;
  std::string listen_address() const;
  void Stop();  // idempotent

  struct Impl;

 private:
  explicit Root(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltacast
