// Producer: one process (or library object) on the trainer that owns a disjoint
// part of the model, a training rank's shard through its layout, a set of canonical
// tensors, or a whole checkpoint, and serves the root's refits with it
// (docs/producers.md). It joins the root like a relay child joins its parent
// (CHALLENGE / HELLO proving the cluster token / WELCOME), and per refit reports
// which canonical partitions it covers, encodes its share's change with no other
// producer's bytes (relay/producers/shard_encoder.h) and streams it under the root's credit.
//
// Thread safety: Serve blocks the calling thread, one at a time; Close may be
// called from any thread to interrupt it.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "common/thread_annotations.h"
#include "quant/serving.h"
#include "relay/producers/fp8_share.h"
#include "relay/producers/shard_encoder.h"
#include "relay/wire/protocol.h"
#include "transport/transport.h"

namespace deltacast::relay {

struct ProducerOptions {
  std::string id;            // this producer's name, e.g. "rank-00003"
  std::string root_address;  // the root's producer listener, "host:port"
  std::string root_id;       // the root's node id: its CHALLENGE must name it
  std::string token;         // the cluster token
  // Dial the root over TLS ("tls://", the transport needs this producer's
  // certificate) and accept only a root whose certificate names root_id: where
  // [security] encrypts producer links (topology::ProducerLinksUseTls), as the root
  // then refuses a producer that comes without.
  bool tls = false;
  codec::EncodeOptions codec;
  size_t threads = 0;  // encode threads; 0 = all cores
  std::chrono::milliseconds connect_timeout{10'000};
  // How long to wait for the root's next message within a refit (and for PRODUCE).
  std::chrono::milliseconds refit_timeout{300'000};
  // Fault injection for tests: at this point of a refit the producer drops its link
  // as if it died ("coverage": after COVERAGE, "encoded": before PRODUCED,
  // "streaming": before its last streamed message) and Serve returns kAborted.
  std::string die_at;
  // Serve FP8 (docs/fp8.md, "Producers"): the share's BF16 versions are quantized
  // under this description (after the amax exchange for blocks held in part) and
  // the FP8 image's change is shipped. Every producer of a root must say the same.
  std::optional<quant::ServingDescription> serving;
};

struct ProduceReport {
  uint64_t refit_id = 0;
  bool committed = false;
  std::string reason;       // why not, when not committed
  uint64_t partitions = 0;  // canonical partitions the share touches
  bool hashed_base = false;
  ShareStats stats;
  uint64_t messages = 0;  // SHARD_CHUNK and PIECES messages sent
  uint64_t sent_bytes = 0;
  double hash_seconds = 0;    // the base hash pass, when the root asked for it
  double encode_seconds = 0;  // compare, project and encode
  double seconds = 0;         // PRODUCE to PRODUCE_END
  // Serving FP8: the quantizer's figures (fp8_stats.base_kept: the previous
  // version's image was the last committed refit's, not quantized again), and the
  // SPLIT_AMAXES bytes sent and received.
  bool fp8 = false;
  Fp8ShareStats fp8_stats;
  uint64_t amax_bytes = 0;
};

class Producer {
 public:
  // Dials the root and joins (retrying until connect_timeout). kUnavailable when it
  // cannot; kFailedPrecondition when the root refuses it (the reason is in the
  // message); kPermissionDenied when the root fails its proof or, with tls, its
  // certificate is not root_id's.
  static Result<std::unique_ptr<Producer>> Connect(ProducerOptions options,
                                                   std::unique_ptr<transport::Transport> transport);
  ~Producer();

  // Serves the root's next refit with `input` (which must not change until this
  // returns): waits for PRODUCE, reports coverage, encodes, streams, and returns once
  // the root ends the refit. The link dropping or a malformed message ends it with
  // an error; the root then aborts the refit.
  Result<ProduceReport> Serve(const ShareInput& input);

  // Closes the link; a Serve in progress returns kAborted.
  void Close();

 private:
  Producer(ProducerOptions options, std::unique_ptr<transport::Transport> transport);
  Status Join();
  // The next message (HEARTBEATs skipped); kUnavailable if the link closed,
  // kTimeout after `timeout`.
  Result<transport::Message> Next(std::chrono::milliseconds timeout);
  Result<transport::Message> Expect(MessageType type, uint64_t refit_id);
  void Send(std::vector<std::byte> bytes);

  ProducerOptions options_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<transport::Connection> link_;
  Mutex mu_;
  CondVar cv_;
  std::deque<transport::Message> inbox_ GUARDED_BY(mu_);  // guarded by mu_
  bool closed_ GUARDED_BY(mu_) = false;                   // guarded by mu_
  // Serving FP8: the image of the last refit that committed, whose new version the
  // next refit starts from (what the receivers hold); Serve's thread only.
  std::unique_ptr<Fp8Share> last_image_;
  Status close_status_ GUARDED_BY(mu_);  // guarded by mu_
};

}  // namespace deltacast::relay
