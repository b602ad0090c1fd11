#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <filesystem>
#include <string>

#include "transport/internal/tcp_stream.h"

namespace deltacast::transport::internal {
namespace {

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

Status Check(const std::filesystem::path& file, std::string_view what) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    return Status::NotFound("tls: " + std::string(what) + " " + file.string() +
                            " does not exist (run `deltacast certs`, and name the files in "
                            "[security])");
  }
  return Status::Ok();
}

Result<std::unique_ptr<ssl::context>> MakeContext(const TlsFiles& files, bool server) {
  auto ctx =
      std::make_unique<ssl::context>(server ? ssl::context::tls_server : ssl::context::tls_client);
  SSL_CTX* native = ctx->native_handle();
  // TLS 1.3 only: no downgrade to a version with weaker handshakes.
  SSL_CTX_set_min_proto_version(native, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(native, TLS1_3_VERSION);
  // AES-128-GCM first: AES-NI makes it the fastest, and it is strong enough.
  SSL_CTX_set_ciphersuites(native,
                           "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                           "TLS_CHACHA20_POLY1305_SHA256");
  // Links are long-lived and never resumed: no session tickets on the wire.
  SSL_CTX_set_num_tickets(native, 0);
  SSL_CTX_set_options(native, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  // Both ends present a certificate of the cluster CA; a peer without one fails
  // the handshake. Which node it is, is the relay's check (PeerIdentity).
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  if (SSL_CTX_load_verify_locations(native, files.ca.c_str(), nullptr) != 1) {
    return Status::InvalidArgument("tls: cannot load the CA certificate " + files.ca.string() +
                                   ": " + OpenSslError());
  }
  if (SSL_CTX_use_certificate_chain_file(native, files.cert.c_str()) != 1) {
    return Status::InvalidArgument("tls: cannot load the certificate " + files.cert.string() +
                                   ": " + OpenSslError());
  }
  if (SSL_CTX_use_PrivateKey_file(native, files.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_error()) == X509_R_KEY_VALUES_MISMATCH) {
      ERR_clear_error();
      return Status::InvalidArgument("tls: the key " + files.key.string() +
                                     " does not match the certificate " + files.cert.string());
    }
    return Status::InvalidArgument("tls: cannot load the private key " + files.key.string() + ": " +
                                   OpenSslError());
  }
  if (SSL_CTX_check_private_key(native) != 1) {
    return Status::InvalidArgument("tls: the key " + files.key.string() +
                                   " does not match the certificate " + files.cert.string());
  }
  return ctx;
}

}  // namespace

Result<TlsContexts> MakeTlsContexts(const TlsFiles& files) {
  RETURN_IF_ERROR(Check(files.ca, "CA certificate"));
  RETURN_IF_ERROR(Check(files.cert, "certificate"));
  RETURN_IF_ERROR(Check(files.key, "private key"));
  TlsContexts contexts;
  ASSIGN_OR_RETURN(contexts.server, MakeContext(files, /*server=*/true));
  ASSIGN_OR_RETURN(contexts.client, MakeContext(files, /*server=*/false));
  return contexts;
}

std::string PeerCommonName(SSL* ssl) {
  // Only a certificate that verified counts (the handshake fails otherwise, but
  // say so here too).
  if (SSL_get_verify_result(ssl) != X509_V_OK) return {};
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (!cert) return {};
  X509_NAME* name = X509_get_subject_name(cert);
  const int at = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
  if (at < 0 || X509_NAME_get_index_by_NID(name, NID_commonName, at) >= 0) return {};  // one CN
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, at));
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(data)),
                     static_cast<size_t>(ASN1_STRING_length(data)));
}

}  // namespace deltacast::transport::internal
