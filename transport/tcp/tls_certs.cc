#include "transport/tcp/tls_certs.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>

namespace deltacast::transport {
namespace {

using Key = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using Cert = std::unique_ptr<X509, decltype(&X509_free)>;

Result<Key> NewKey() {
  EVP_PKEY* key = nullptr;
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr);
  const bool ok = ctx && EVP_PKEY_keygen_init(ctx) == 1 && EVP_PKEY_keygen(ctx, &key) == 1;
  EVP_PKEY_CTX_free(ctx);
  if (!ok) return Status::Internal("OpenSSL could not generate an Ed25519 key");
  return Key(key, EVP_PKEY_free);
}

Status AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext) return Status::Internal(std::string("cannot make certificate extension ") + value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return Status::Ok();
}

// A certificate for `key` named `common_name`, signed by `issuer_key` (issuer null:
// self-signed, a CA).
Result<Cert> Issue(EVP_PKEY* key, const std::string& common_name, X509* issuer,
                   EVP_PKEY* issuer_key, int days) {
  Cert cert(X509_new(), X509_free);
  if (!cert) return Status::ResourceExhausted("cannot allocate a certificate");
  X509_set_version(cert.get(), 2);  // v3
  unsigned char serial[16];
  RAND_bytes(serial, sizeof serial);
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);  // an hour of clock skew
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), int64_t{days} * 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("deltacast"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  const bool ca = issuer == nullptr;
  X509_set_issuer_name(cert.get(), ca ? name : X509_get_subject_name(issuer));
  X509* signer = ca ? cert.get() : issuer;
  RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_basic_constraints,
                               ca ? "critical,CA:TRUE,pathlen:0" : "critical,CA:FALSE"));
  RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_key_usage,
                               ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature"));
  if (!ca) {
    // Every node is a server to its children and a client to its parent.
    RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth"));
  }
  RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_key_identifier, "hash"));
  if (X509_sign(cert.get(), ca ? key : issuer_key, nullptr) == 0) {  // Ed25519: no digest
    return Status::Internal("cannot sign the certificate of " + common_name);
  }
  return cert;
}

// Writes with `mode` from the start (a key is never readable by others, even briefly).
Status WritePemFile(const std::filesystem::path& path, int mode,
                    const std::function<int(FILE*)>& write_pem) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return Status::FromErrno(errno, "creating " + path.string());
  FILE* f = ::fdopen(fd, "w");
  if (!f) {
    ::close(fd);
    return Status::FromErrno(errno, "opening " + path.string());
  }
  const bool ok = write_pem(f) == 1 && std::fflush(f) == 0 && ::fsync(fd) == 0;
  std::fclose(f);
  if (!ok) return Status::IoError("writing " + path.string());
  return Status::Ok();
}

Status WriteKey(const std::filesystem::path& path, EVP_PKEY* key) {
  return WritePemFile(path, 0600, [key](FILE* f) {
    return PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  });
}

Status WriteCert(const std::filesystem::path& path, X509* cert) {
  return WritePemFile(path, 0644, [cert](FILE* f) { return PEM_write_X509(f, cert); });
}

Result<Key> ReadKey(const std::filesystem::path& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return Status::FromErrno(errno, "opening " + path.string());
  EVP_PKEY* key = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (!key) return Status::InvalidArgument(path.string() + " holds no PEM private key");
  return Key(key, EVP_PKEY_free);
}

Result<Cert> ReadCert(const std::filesystem::path& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return Status::FromErrno(errno, "opening " + path.string());
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (!cert) return Status::InvalidArgument(path.string() + " holds no PEM certificate");
  return Cert(cert, X509_free);
}

bool SafeFileName(const std::string& id) {
  return !id.empty() && id != "." && id != ".." && id != "ca" &&
         id.find('/') == std::string::npos && id.find('\0') == std::string::npos;
}

}  // namespace

Result<CertificateFiles> WriteClusterCertificates(const std::filesystem::path& dir,
                                                  const std::vector<std::string>& node_ids,
                                                  int days) {
  if (days < 1) return Status::InvalidArgument("certificates must be valid for at least a day");
  for (const auto& id : node_ids) {
    if (!SafeFileName(id)) {
      return Status::InvalidArgument("node id '" + id + "' cannot name a certificate file");
    }
  }
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::IoError("creating " + dir.string() + ": " + ec.message());
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
  }
  CertificateFiles files;
  const auto ca_crt = dir / "ca.crt", ca_key = dir / "ca.key";
  Key ca_pkey(nullptr, EVP_PKEY_free);
  Cert ca_cert(nullptr, X509_free);
  if (std::filesystem::exists(ca_crt) && std::filesystem::exists(ca_key)) {
    ASSIGN_OR_RETURN(ca_pkey, ReadKey(ca_key));
    ASSIGN_OR_RETURN(ca_cert, ReadCert(ca_crt));
    if (X509_check_private_key(ca_cert.get(), ca_pkey.get()) != 1) {
      return Status::InvalidArgument(ca_key.string() + " is not the key of " + ca_crt.string());
    }
    files.kept.push_back(ca_crt);
    files.kept.push_back(ca_key);
  } else if (std::filesystem::exists(ca_crt) || std::filesystem::exists(ca_key)) {
    return Status::FailedPrecondition(dir.string() +
                                      " holds only half a CA (ca.crt or ca.key): remove it or "
                                      "bring back the other half");
  } else {
    ASSIGN_OR_RETURN(ca_pkey, NewKey());
    ASSIGN_OR_RETURN(ca_cert, Issue(ca_pkey.get(), "deltacast cluster CA", nullptr, nullptr, days));
    RETURN_IF_ERROR(WriteKey(ca_key, ca_pkey.get()));
    RETURN_IF_ERROR(WriteCert(ca_crt, ca_cert.get()));
    files.written.push_back(ca_crt);
    files.written.push_back(ca_key);
  }
  for (const auto& id : node_ids) {
    const auto crt = dir / (id + ".crt"), key_path = dir / (id + ".key");
    if (std::filesystem::exists(crt) && std::filesystem::exists(key_path)) {
      files.kept.push_back(crt);
      continue;
    }
    std::filesystem::remove(crt, ec);
    std::filesystem::remove(key_path, ec);
    ASSIGN_OR_RETURN(Key key, NewKey());
    ASSIGN_OR_RETURN(Cert cert, Issue(key.get(), id, ca_cert.get(), ca_pkey.get(), days));
    RETURN_IF_ERROR(WriteKey(key_path, key.get()));
    RETURN_IF_ERROR(WriteCert(crt, cert.get()));
    files.written.push_back(crt);
    files.written.push_back(key_path);
  }
  return files;
}

}  // namespace deltacast::transport
