// What a child that (re)joins in the middle of a refit is sent, by the source or a
// relay: the refit's BEGIN, every spooled chunk its HELLO does not list as applied
// (all of them if it holds another delta), and the decision if one was made.
//
// Thread safety: a free function; the spool must outlive the messages' loaders.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "relay/store/spool.h"
#include "relay/tree/downstream.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {

struct Replay {
  std::vector<Downstream::Outgoing> messages;
  size_t chunks = 0;  // of messages: the chunks replayed
};

// `spool` may be null (nothing to replay); `decision` is the refit's decision
// message as the source signed it, if made (COMMIT or ABORT of refit
// `begin.refit_id`), else null. `begin` is re-encoded with its signature.
Replay ReplayFor(const Hello& hello, const Begin& begin, Spool* spool, transport::Message decision);
// The same, the loaders sharing ownership of `spool`: a node's refit may end (and
// drop its spool) while a replay is still queued for a child.
Replay ReplayFor(const Hello& hello, const Begin& begin, std::shared_ptr<Spool> spool,
                 transport::Message decision);

// Every chunk `spool` holds of `begin`'s delta, as loaders sharing ownership of it:
// what a node that resumes the delta holds already, which its parent will not send
// again and so it does not forward live (Downstream::QueueHeld).
std::vector<Downstream::Outgoing> HeldChunks(const Begin& begin, std::shared_ptr<Spool> spool);

}  // namespace deltacast::relay
