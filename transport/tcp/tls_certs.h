// The cluster's certificates for TLS on tcp links (docs/transport.md, "TLS"): a CA,
// and for every node a key and a certificate the CA issues, whose subject CN is the
// node id (what Connection::PeerIdentity() reports and the relay checks). What
// `deltacast certs` writes.
//
// Thread safety: a free function; not for concurrent use on one directory.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "common/status.h"

namespace deltacast::transport {

struct CertificateFiles {
  std::vector<std::filesystem::path> written;  // created by this call
  std::vector<std::filesystem::path> kept;     // already there, left as they were
};

// Creates `dir` (mode 0700) if needed and writes ca.crt and ca.key, then
// NODE.crt and NODE.key for each of `node_ids` (keys mode 0600). An existing CA
// (ca.crt with ca.key) is reused and existing node files are kept, so running it
// again after adding nodes issues only theirs. Keys are Ed25519; certificates are
// valid for `days` days. kInvalidArgument for an id that cannot be a file name.
Result<CertificateFiles> WriteClusterCertificates(const std::filesystem::path& dir,
                                                  const std::vector<std::string>& node_ids,
                                                  int days = 825);

}  // namespace deltacast::transport
