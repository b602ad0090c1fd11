// SenderAgent: a trainer-side sender host that roots one stripe (docs/protocol.md,
// "Stripes", "Senders"; topology/stripe_plan.h, StripeTree::feeder). It joins the
// source as its child on the link of its stripe (over the plan's feeder transports),
// is sent that stripe's data chunks (sequence k with k mod S = its stripe) and the
// END, spools them and forwards each down its stripe's tree at once. It holds no
// weights: it checks what it can (chunk checksums, the refit identity BEGIN named,
// the source's signatures when the cluster signs) and never reports itself PREPARED:
// its PREPARED up is its subtree's aggregate (every planned node of the stripe's tree
// that prepared, under the commit policy), and its COMMITTED / ABORTED the count of
// nodes that confirmed. The source's decision goes down as the source signed it.
// Requests its children send up (FETCH of partition bytes, catch-up manifests,
// chains and kept delta chunks) are forwarded to the source and the answers passed
// back (UpRequests): a sender holds none of it. ACTIVE_VERSION is passed on too, so
// a child's join check works through it.
//
// Why a class of its own rather than a "no store" mode of NodeAgent: nearly all of
// NodeAgent is about the store (apply, journal, catch-up, rollback, recovery, torn
// repair, resolving deltas held from earlier refits), and each of those paths would
// need a "no store" branch. The sender is the small part they share: ParentLink,
// Downstream, Subtree, the spool and the replay, wired together here.
//
// Thread safety: Start/Stop from one thread; stats() from any thread. Everything else
// runs on the agent's loop thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "common/status.h"
#include "relay/wire/signing.h"
#include "topology/cluster_config.h"
#include "topology/stripe_plan.h"
#include "transport/transport.h"

namespace deltacast::relay {

struct SenderAgentOptions {
  topology::ClusterConfig config;
  std::string node_id;  // a node with role = "sender" that roots a stripe
  std::string token;    // the cluster's shared secret
  // The source's public key ([security] verify_key): with it, BEGIN, every CHUNK,
  // COMMIT and ABORT must carry the source's signature, or the link is refused.
  std::shared_ptr<const VerifyKey> verify_key;
  // Where the stripe's chunks are spooled; empty: a folder of this process's own.
  std::filesystem::path spool_dir;
};

struct SenderAgentStats {
  uint64_t parent_joins = 0;      // times it joined the source
  uint64_t children_joined = 0;   // child links that passed the handshake
  uint64_t refits_begun = 0;      // BEGINs of new refits
  uint64_t refits_committed = 0;  // outcomes reported up
  uint64_t refits_aborted = 0;
  uint64_t last_committed_refit = 0;  // the refit id of the last COMMITTED it sent up
  uint64_t chunks_received = 0;       // CHUNK messages taken (data and END), once each
  uint64_t chunk_bytes_received = 0;
  uint64_t chunks_refused = 0;      // failed their checks (the link was dropped)
  uint64_t requests_forwarded = 0;  // children's up-requests passed to the source
};

class SenderAgent {
 public:
  // Listens on the node's address and joins the source. kInvalidArgument when the
  // node is not a sender that roots a stripe of the config's plan.
  static Result<std::unique_ptr<SenderAgent>> Start(
      SenderAgentOptions options, std::unique_ptr<transport::Transport> transport);
  // The same along a plan given (tests).
  static Result<std::unique_ptr<SenderAgent>> Start(SenderAgentOptions options,
                                                    std::unique_ptr<transport::Transport> transport,
                                                    const topology::StripedPlan& plan);
  ~SenderAgent();  // Stop()
  void Stop();     // closes every link; idempotent
  SenderAgentStats stats() const;
  const std::string& listen_address() const;

  class Impl;

 private:
  explicit SenderAgent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The stripe a sender roots in `plan` (its index), or -1 when `node_id` roots none.
int StripeRootedBy(const topology::StripedPlan& plan, const std::string& node_id);

// `stripe`'s tree with its feeder (the source) added above its root: the hops the
// source and the sender run, for CheckHopSecurity. The tree itself when not fed.
topology::TreePlan TreeWithFeeder(const topology::StripeTree& stripe);

}  // namespace deltacast::relay
