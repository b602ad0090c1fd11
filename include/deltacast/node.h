// Node: a receiver of the relay tree (a rollout worker). It joins its parent from
// the config's plan, forwards every chunk to its own children, patches its weights
// in place, verifies them, and commits each version when the whole tree does;
// nothing is left torn by a crash or an abort. Weights are either the caller's own
// tensors in host memory (version state in memory) or a safetensors checkpoint
// directory (version state journaled under DIR/.deltacast/, so it survives a restart).
//
// Thread safety: Start and Stop from one thread; stats() and version() from any.
// on_commit runs on the node's apply thread: the weights are at the new version
// when it is called; keep it short.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deltacast/config.h"
#include "deltacast/status.h"
#include "deltacast/tensor.h"

namespace deltacast {

struct CommitEvent {
  uint64_t refit_id = 0;
  std::string version;                       // now active, hex
  std::vector<std::string> changed_tensors;  // canonical names, sorted
};

struct NodeOptions {
  std::string node_id;                                // this node's id in the config
  std::string token;                                  // the cluster's shared secret
  size_t apply_threads = 0;                           // 0 = all cores
  std::function<void(const CommitEvent&)> on_commit;  // optional
  // Where received chunks are spooled (replays to children, rollback). Empty: inside
  // the checkpoint directory, or a per-process folder for host tensors.
  std::filesystem::path spool_dir;

  // How the node writes each refit's delta into the weights (docs/serving.md):
  //   "on-arrival": chunk by chunk as they come; PREPARED means the weights are at
  //     the target. For weights nobody serves from during a refit.
  //   "staged": chunks are verified, spooled, forwarded and checked against the
  //     target without a byte written; PREPARED means the node holds a verified
  //     delta; the write happens at COMMIT, between pause_engine and resume_engine.
  //   "" (default): the config's [[node]] apply, itself "on-arrival" by default.
  std::string apply_mode;
  // What a checkpoint directory (StartOnCheckpoint) holds on disk (docs/config.md):
  //   "in-place": the committed version; every commit is written back (O(model)).
  //   "snapshot": a base snapshot plus the committed deltas; the weights are patched
  //     in memory and a commit writes O(delta). `deltacast materialize` writes the
  //     committed version out as a checkpoint directory.
  //   "" (default): the config's [[node]] checkpoint, itself "in-place" by default.
  std::string checkpoint;
  // An inference engine serving from these weights. pause_engine is called before
  // any write to them and must return once the engine no longer reads them (an
  // error, or no return within hook_timeout: nothing is written, and this node
  // fails the commit; it catches up at the next refit); resume_engine once they are
  // whole again, at one version. Staged, that is only the commit's apply (plus the
  // rare catch-up of missed versions, a rollback after a restart, or recovery after
  // a machine crash); on-arrival, from the refit's first write to its commit.
  // Both run on a thread of the node's own, one at a time, never during a write; a
  // pause that returns late but succeeds is followed by resume_engine, so a late
  // pause never leaves the engine paused; while the weights are not whole (a store
  // being mended) the engine stays paused. Stop waits for a hook still running.
  // Optional. docs/serving.md has the whole contract.
  std::function<Status()> pause_engine;
  std::function<void()> resume_engine;
  std::chrono::milliseconds hook_timeout{10'000};
};

// One stripe's share of a node's traffic (docs/protocol.md, "Stripes"): what came
// on its parent link in that stripe's tree. A node that lost one stripe's parent
// shows it here: that stripe's parent_joins rise, the others' do not.
struct StripeStats {
  // CHUNK messages that came on the stripe's parent link: data chunks and the
  // stripe's END, replays included.
  uint64_t chunks = 0;
  // Of those, the payload bytes this node already had (as chunk_bytes_resent).
  uint64_t chunk_bytes_resent = 0;
  // Times this node joined the stripe's parent (1 + reconnects, failovers included).
  uint64_t parent_joins = 0;
};

struct NodeStats {
  uint64_t refits_committed = 0;
  uint64_t refits_aborted = 0;
  uint64_t chunk_bytes_received = 0;
  uint64_t chunk_bytes_resent = 0;  // received though this node had them (0 when all is well)
  uint64_t parent_joins = 0;
  uint64_t partitions_repaired = 0;
  uint64_t partitions_caught_up = 0;
  uint64_t deltas_caught_up = 0;
  std::string version;  // active, hex
  // The last refit: how long the engine was paused for its writes (staged: the
  // commit's apply; on-arrival: first write to commit), and how long the node held
  // its verified delta before the decision came (the engine served meanwhile when
  // staged). And the pauses of every refit so far, summed.
  double last_pause_seconds = 0;
  double last_prepared_hold_seconds = 0;
  double pause_seconds_total = 0;
  // Indexed by stripe, one entry per stripe of the config's plan ([tree] stripes);
  // empty when the tree is not striped (one stripe: the totals above say it all).
  // Each counter summed over the stripes is its total above (chunk_bytes_resent,
  // parent_joins).
  std::vector<StripeStats> stripes;
};

// One tensor whose bytes or description differ from a version (Node::Verify,
// Node::WaitForJoin).
struct TensorMismatch {
  std::string tensor;
  // "bits differ in partitions 3..5, 9 (4 of 12)", "dtype F16, expected BF16",
  // "shape [8, 4], expected [4, 8]", "missing", "not in the reference (...)".
  std::string what;
};

// Node::Verify: the weights hashed now against the version the node holds active.
struct VerifyReport {
  std::string version;  // active, hex
  uint64_t tensors = 0;
  uint64_t partitions = 0;
  std::vector<TensorMismatch> mismatches;  // empty: every partition is the version's
  bool ok() const { return mismatches.empty(); }
  std::string summary;  // one line: "no difference", or the first mismatches
};

// One GPU of an inference engine: its parameters as the engine holds them (the
// engine's names, dtypes and shapes; `bytes` lies in the memory of CUDA device
// `device`, or in host memory when device is -1), and the layout file that places
// them in canonical terms (docs/layout.md; its `canonical` table lists the
// checkpoint's tensors): WriteEngineLayouts below for vLLM and SGLang, or written by
// hand. Fused parameters (qkv_proj, gate_up_proj), replicated KV heads,
// vocabulary-parallel embeddings, stacked experts and replicated norms are rules of
// the layout.
//
// `stream` is the engine's CUDA stream (a cudaStream_t as an integer; 1 is the
// legacy default stream, what Python's `__dlpack__(stream=1)` orders a tensor's
// producer with) on which it last wrote the parameters: the node reads them only
// after the work queued there when StartOnGpus is called, without blocking the host.
// 0 (the default) waits until the whole device is idle instead.
//
// What the engine must guarantee while the node runs: it does not write the
// registered parameters (the node owns their bits from StartOnGpus to Stop: an
// engine write would make the partition read torn, and the node would repair it
// from the tree), and it does not free or move them. During a refit (a delta's
// first chunk to its commit or abort) patches land while the engine may read: a
// forward pass then sees some tensors, even some elements, at the new version and
// others at the old. An engine that needs whole versions and keeps serving uses
// NodeOptions::apply_mode = "staged" and its pause/resume hooks: nothing is written
// before COMMIT, and the hooks bracket the write (docs/serving.md).
// Registered parameters must be device memory of `device`, aligned to their element
// size, and must not overlap (tied embeddings: register the shared tensor once);
// StartOnGpus refuses any of these with kInvalidArgument before it touches a byte.
struct GpuWeights {
  int device = 0;
  std::filesystem::path layout;
  std::vector<TensorView> parameters;
  uintptr_t stream = 0;
};

// Load plans generated for a vLLM or SGLang engine (docs/layout.md, "Engine
// layouts"): the engine's parallel settings and the checkpoint's config.json.
struct EngineLayoutOptions {
  std::filesystem::path config;     // the checkpoint's config.json
  std::filesystem::path canonical;  // checkpoint directory or canonical.json; empty: config's
  std::filesystem::path out_dir;    // where gpu-<g>.toml are written (created if missing)
  std::string engine = "vllm";      // "vllm" | "sglang"
  uint64_t tp = 1;                  // tensor parallel
  uint64_t dp = 1;                  // data parallel (vLLM)
  uint64_t ep = 1;                  // expert parallel: vLLM 1 or tp * dp; SGLang a divisor of tp
};

// Writes each GPU's layout file and returns their paths in the engine's rank order
// (GPU g: dp rank g / tp, tp rank g % tp), each a GpuWeights::layout. Refuses,
// naming the setting, a model or split the generator does not cover (a KV
// replication factor or a size that does not divide, an unknown engine).
Result<std::vector<std::filesystem::path>> WriteEngineLayouts(const EngineLayoutOptions& options);

class Node {
 public:
  // A node over the caller's tensors: they must hold the cluster's current version,
  // and stay alive, unmoved, until Stop returns.
  static Result<std::unique_ptr<Node>> Start(const Config& config, NodeOptions options,
                                             std::vector<TensorView> weights);
  // A node over an engine's GPUs: each GPU's parameters are patched in place by
  // kernels on that GPU (addresses never change: CUDA graphs stay valid), and a
  // canonical partition verifies only when every GPU's pieces of it combine to its
  // hash, so the node prepares when every GPU's part is right. The parameters must
  // hold the cluster's current version and stay allocated until Stop returns.
  static Result<std::unique_ptr<Node>> StartOnGpus(const Config& config, NodeOptions options,
                                                   std::vector<GpuWeights> gpus);
  // A node over a safetensors checkpoint directory, patched in place.
  static Result<std::unique_ptr<Node>> StartOnCheckpoint(const Config& config, NodeOptions options,
                                                         const std::filesystem::path& dir);
  ~Node();  // Stop()
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  void Stop();  // closes every link, joins the node's threads; idempotent
  NodeStats stats() const;

  // What joining the parent found, once the parent said the version it holds (or
  // it refused this node), waiting at most `timeout`:
  //   Ok: joined, and the weights are the cluster's version (or the parent does
  //     not know one yet: a source before its first publish; checked then);
  //   kFailedPrecondition: the weights are another version; the message names the
  //     tensors that differ (name, dtype, shape, or the partitions whose bits
  //     differ). Weights of an earlier version of this cluster still catch up at
  //     the next refit; any others make that refit fail;
  //   kPermissionDenied: refused at the door (a wrong cluster token, another
  //     node's certificate, a parent that could not prove the token);
  //   kUnavailable: not joined within `timeout` (the parent is down or unreachable).
  // Call it after Start to catch a wrong token or wrong weights before any publish.
  Status WaitForJoin(std::chrono::milliseconds timeout) const;
  // Hashes every partition of the weights now (host, checkpoint or GPU memory) and
  // compares them with the version the node holds active: the audit of what landed.
  // Blocks for a full read of the weights; between refits (kFailedPrecondition while
  // a delta is in flight).
  Result<VerifyReport> Verify();
  std::string listen_address() const;

  struct Impl;

 private:
  explicit Node(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltacast
