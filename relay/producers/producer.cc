#include "relay/producers/producer.h"

#include <fmt/core.h>

#include <future>
#include <thread>

#include "common/crash_point.h"
#include "common/elapsed.h"
#include "common/log.h"
#include "common/thread_annotations.h"
#include "relay/producers/producer_protocol.h"
#include "relay/wire/internal/peer_identity.h"

namespace deltacast::relay {
namespace {

using Clock = std::chrono::steady_clock;

// The messages a producer streams: its chunks, then its pieces in PIECES messages
// of about a chunk each.
std::vector<std::vector<std::byte>> StreamMessages(uint64_t refit_id, const EncodedShare& share,
                                                   uint64_t chunk_bytes, uint32_t& piece_messages) {
  std::vector<std::vector<std::byte>> out;
  for (const auto& chunk : share.chunks) out.push_back(EncodeShardChunk(refit_id, chunk));
  piece_messages = 0;
  size_t first = 0, bytes = 0;
  for (size_t i = 0; i < share.pieces.size(); ++i) {
    bytes += share.pieces[i].encoded.payload.size() + 64;
    if (bytes >= chunk_bytes || i + 1 == share.pieces.size()) {
      out.push_back(EncodePieces(
          refit_id, std::span<const SharePiece>(share.pieces).subspan(first, i + 1 - first)));
      ++piece_messages;
      first = i + 1;
      bytes = 0;
    }
  }
  return out;
}

}  // namespace

Producer::Producer(ProducerOptions options, std::unique_ptr<transport::Transport> transport)
    : options_(std::move(options)), transport_(std::move(transport)) {}

Producer::~Producer() {
  Close();
  transport_->Shutdown();
}

void Producer::Close() {
  {
    MutexLock lock(mu_);
    if (!closed_) close_status_ = Status::Aborted("producer closed");
    closed_ = true;
    cv_.notify_all();
  }
  if (link_) link_->Close();
}

void Producer::Send(std::vector<std::byte> bytes) {
  link_->Send(transport::MakeMessage(std::move(bytes)));
}

Result<std::unique_ptr<Producer>> Producer::Connect(
    ProducerOptions options, std::unique_ptr<transport::Transport> transport) {
  std::unique_ptr<Producer> p(new Producer(std::move(options), std::move(transport)));
  RETURN_IF_ERROR(p->Join());
  return p;
}

Status Producer::Join() {
  const auto deadline = Clock::now() + options_.connect_timeout;
  Status last = Status::Unavailable("no attempt");
  const std::string address = (options_.tls ? "tls://" : "") + options_.root_address;
  while (Clock::now() < deadline) {
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto c = transport::ConnectBlocking(*transport_, address,
                                        std::min(remaining, std::chrono::milliseconds(2000)));
    if (c.ok()) {
      link_ = std::move(*c);
      break;
    }
    last = c.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!link_) {
    return Status::Unavailable("producer " + options_.id + " cannot reach the root at " + address +
                               ": " + last.ToString());
  }
  // As a node checks its parent: before saying anything, the root's certificate
  // must be the root's (a cluster certificate of another node or producer is not).
  if (Status s =
          CheckDialledIdentity(link_->PeerIdentity(), options_.root_id, options_.tls,
                               "the producer link " + options_.id + " -> " + options_.root_id);
      !s.ok()) {
    log::Error(
        fmt::format("producer {}: refusing the root at {}: {}", options_.id, address, s.message()));
    link_->Close();
    link_.reset();
    return s.WithContext("producer " + options_.id + ": the root at " + address);
  }
  link_->Start(
      [this](transport::Message m) {
        MutexLock lock(mu_);
        inbox_.push_back(std::move(m));
        cv_.notify_all();
      },
      [this](Status s) {
        MutexLock lock(mu_);
        if (!closed_) close_status_ = s.ok() ? Status::Unavailable("the root closed the link") : s;
        closed_ = true;
        cv_.notify_all();
      });
  ASSIGN_OR_RETURN(transport::Message first, Next(options_.connect_timeout));
  auto challenge = ParseChallenge(ByteSpan(*first));
  if (!challenge.ok()) return challenge.status().WithContext("root's first message");
  if (challenge->parent_id != options_.root_id) {
    return Status::FailedPrecondition("the node at " + options_.root_address + " is '" +
                                      challenge->parent_id + "', not the root '" +
                                      options_.root_id + "'");
  }
  Hello hello;
  hello.node_id = options_.id;
  hello.proof = ChildProof(options_.token, challenge->nonce, options_.id, options_.root_id);
  hello.nonce = RandomNonce();
  hello.transport = transport_->capabilities().backend;
  Send(EncodeHello(hello));
  ASSIGN_OR_RETURN(transport::Message answer, Next(options_.connect_timeout));
  auto type = PeekType(ByteSpan(*answer));
  if (type.ok() && *type == MessageType::kWelcome) {
    // The root must hold the token too, as a relay parent must (docs/protocol.md,
    // "Handshake"): whoever took the root's port could otherwise pull every share.
    auto welcome = ParseWelcome(ByteSpan(*answer));
    if (!welcome.ok()) return welcome.status().WithContext("root's WELCOME");
    if (!ProofMatches(welcome->proof, ParentProof(options_.token, challenge->nonce, hello.nonce,
                                                  options_.root_id, options_.id))) {
      // Told why before the link closes (closing at once would drop the queued REFUSE);
      // a root that never takes it costs a second at most.
      auto sent = std::make_shared<std::promise<void>>();
      auto done = sent->get_future();
      link_->Send(transport::MakeMessage(EncodeRefuse({"wrong token proof"})),
                  [sent](Status) { sent->set_value(); });
      done.wait_for(std::chrono::seconds(1));
      return Status::PermissionDenied("the node at " + options_.root_address +
                                      " answering as root '" + options_.root_id +
                                      "' failed authentication (its WELCOME does not prove the "
                                      "cluster token)");
    }
    link_->Authenticated();
    log::Info(fmt::format("producer {}: joined root {} at {}{}", options_.id, options_.root_id,
                          options_.root_address, link_->PeerIdentity().empty() ? "" : " with TLS"));
    return Status::Ok();
  }
  auto refused = ParseRefuse(ByteSpan(*answer));
  return Status::FailedPrecondition(
      "root refused producer " + options_.id + ": " +
      log::Escape(refused.ok() ? refused->reason : "unexpected answer"));
}

Result<transport::Message> Producer::Next(std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  const auto deadline = Clock::now() + timeout;
  while (true) {
    while (!inbox_.empty()) {
      transport::Message m = std::move(inbox_.front());
      inbox_.pop_front();
      auto type = PeekType(ByteSpan(*m));
      if (type.ok() && *type == MessageType::kHeartbeat) continue;
      return m;
    }
    if (closed_) return close_status_;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && inbox_.empty()) {
      return Status::Timeout("producer " + options_.id + ": the root said nothing for " +
                             std::to_string(timeout.count()) + " ms");
    }
  }
}

// The next message, which must be `type` of this refit, or PRODUCE_END (the root
// gave up on the refit): kAborted with its reason.
Result<transport::Message> Producer::Expect(MessageType type, uint64_t refit_id) {
  ASSIGN_OR_RETURN(transport::Message m, Next(options_.refit_timeout));
  ASSIGN_OR_RETURN(MessageType got, PeekType(ByteSpan(*m)));
  if (got == MessageType::kProduceEnd) {
    ASSIGN_OR_RETURN(ProduceEnd end, ParseProduceEnd(ByteSpan(*m)));
    if (end.refit_id == refit_id) return Status::Aborted("the root ended the refit: " + end.reason);
  }
  if (got != type) {
    return Status::Corrupt("expected " + std::string(MessageTypeName(type)) +
                           " from the root, got " + std::string(MessageTypeName(got)));
  }
  return m;
}

Result<ProduceReport> Producer::Serve(const ShareInput& input) {
  ProduceReport report;
  ASSIGN_OR_RETURN(transport::Message first, Next(options_.refit_timeout));
  ASSIGN_OR_RETURN(Produce produce, ParseProduce(ByteSpan(*first)));
  const auto start = Clock::now();
  report.refit_id = produce.refit_id;
  auto fail = [&](const Status& s) {
    Failed f{produce.refit_id, options_.id, s.ToString()};
    Send(EncodeFailed(f));
    return s;
  };
  auto die = [&](std::string_view point) {
    if (options_.die_at != point) return false;
    log::Warn(fmt::format("producer {}: dying at {} (fault injection)", options_.id, point));
    link_->Abort();
    Close();
    return true;
  };

  // Serving FP8: quantize the share (split blocks after the amax exchange) and
  // serve its FP8 image from here on.
  std::unique_ptr<Fp8Share> fp8;
  ShareInput image;
  if (options_.serving) {
    report.fp8 = true;
    auto plan = quant::PlanServing(*options_.serving, input.map->canonical());
    if (!plan.ok()) return fail(plan.status().WithContext("serving " + options_.serving->source));
    auto share = Fp8Share::Plan(input, std::move(*plan));
    if (!share.ok()) return fail(share.status());
    fp8 = std::move(*share);
    // The last committed image is the receivers' version: start from it when the
    // layout is the same (a stale one is caught by the root's base proof check).
    if (last_image_) (void)fp8->TakeBaseFrom(*last_image_);
    last_image_.reset();
    if (Status s = fp8->ComputeAmaxes(options_.threads); !s.ok()) return fail(s);
    std::vector<std::byte> up = EncodeSplitAmaxes({produce.refit_id, fp8->SplitBlocks()});
    report.amax_bytes += up.size();
    Send(std::move(up));
    ASSIGN_OR_RETURN(transport::Message answer_message,
                     Expect(MessageType::kSplitAmaxes, produce.refit_id));
    report.amax_bytes += answer_message->size();
    auto answer = ParseSplitAmaxes(ByteSpan(*answer_message));
    if (!answer.ok()) return fail(answer.status());
    if (Status s = fp8->SetSplitAmaxes(answer->blocks); !s.ok()) return fail(s);
    if (Status s = fp8->Quantize(options_.threads); !s.ok()) return fail(s);
    report.fp8_stats = fp8->stats();
    image = fp8->Input();
  }
  const ShareInput& share = fp8 ? image : input;

  Coverage coverage;
  coverage.refit_id = produce.refit_id;
  for (const auto& t : share.map->canonical())
    coverage.tensors.push_back({t.name, t.dtype, t.shape});
  coverage.shares = ShareCoverage(*share.map, produce.partition_bytes);
  coverage.layout_name = share.map->name();
  coverage.runs = share.map->runs();
  report.partitions = coverage.shares.size();
  if (produce.hash_base) {
    const auto hash_start = Clock::now();
    auto pieces = HashShare(share, coverage.shares, produce.partition_bytes, options_.threads);
    if (!pieces.ok()) return fail(pieces.status());
    coverage.base_pieces = std::move(*pieces);
    report.hash_seconds = SecondsSince<Clock>(hash_start);
    report.hashed_base = true;
  }
  Send(EncodeCoverage(coverage));
  if (die("coverage")) return Status::Aborted("died after COVERAGE");

  ASSIGN_OR_RETURN(transport::Message hashes_message,
                   Expect(MessageType::kBaseHashes, produce.refit_id));
  ASSIGN_OR_RETURN(BaseHashes hashes, ParseBaseHashes(ByteSpan(*hashes_message)));
  if (hashes.refit_id != produce.refit_id || hashes.hashes.size() != coverage.shares.size()) {
    return fail(Status::Corrupt("BASE_HASHES for " + std::to_string(hashes.hashes.size()) +
                                " partitions; the share covers " +
                                std::to_string(coverage.shares.size())));
  }

  ShareEncodeOptions encode;
  encode.codec = options_.codec;
  encode.chunk_bytes = produce.chunk_bytes;
  encode.partition_bytes = produce.partition_bytes;
  encode.threads = options_.threads;
  auto encoded = EncodeShare(share, coverage.shares, hashes.hashes, encode);
  if (!encoded.ok()) return fail(encoded.status());
  report.stats = encoded->stats;
  report.encode_seconds = encoded->stats.seconds;
  CrashPoint("producer.encoded");
  if (die("encoded")) return Status::Aborted("died before PRODUCED");

  Produced produced;
  produced.refit_id = produce.refit_id;
  produced.chunks = static_cast<uint32_t>(encoded->chunks.size());
  produced.pieces = static_cast<uint32_t>(encoded->pieces.size());
  uint64_t piece_changes = 0;
  for (const auto& p : encoded->pieces) piece_changes += p.encoded.change_count;
  produced.changed_elements = encoded->stats.changed_elements - piece_changes;
  produced.local_bytes = encoded->stats.local_bytes;
  produced.seconds = encoded->stats.seconds;
  produced.changes = encoded->changes;
  produced.base_pieces = encoded->base_pieces;
  std::vector<std::vector<std::byte>> stream =
      StreamMessages(produce.refit_id, *encoded, produce.chunk_bytes, produced.piece_messages);
  *encoded = EncodedShare{};  // the stream holds the bytes now
  Send(EncodeProduced(produced));

  // Stream under the root's credit; then wait for the outcome.
  size_t sent = 0;
  uint64_t credit = 0;
  while (true) {
    while (credit > 0 && sent < stream.size()) {
      if (sent + 1 == stream.size()) {
        // Before the last message: whatever the share's size, the root is left
        // with part of it (after the first, a one-message share would be whole).
        CrashPoint("producer.streaming");
        if (die("streaming")) return Status::Aborted("died while streaming");
      }
      report.sent_bytes += stream[sent].size();
      Send(std::move(stream[sent++]));
      --credit;
      ++report.messages;
    }
    ASSIGN_OR_RETURN(transport::Message m, Next(options_.refit_timeout));
    ASSIGN_OR_RETURN(MessageType type, PeekType(ByteSpan(*m)));
    if (type == MessageType::kPull) {
      ASSIGN_OR_RETURN(Pull pull, ParsePull(ByteSpan(*m)));
      if (pull.refit_id == produce.refit_id) credit += pull.messages;
      continue;
    }
    if (type == MessageType::kProduceEnd) {
      ASSIGN_OR_RETURN(ProduceEnd end, ParseProduceEnd(ByteSpan(*m)));
      if (end.refit_id != produce.refit_id) continue;
      report.committed = end.committed;
      report.reason = end.reason;
      if (fp8 && end.committed) last_image_ = std::move(fp8);
      report.seconds = SecondsSince<Clock>(start);
      return report;
    }
    return fail(
        Status::Corrupt(std::string(MessageTypeName(type)) + " from the root while streaming"));
  }
}

}  // namespace deltacast::relay
