#include "coord/etcd_client.h"

#include <curl/curl.h>

#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "topology/coordination_config.h"

namespace deltacast::coord {
namespace {

using json = nlohmann::json;

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 |
                       uint32_t(uint8_t(in[i + 2]));
    out += kBase64[v >> 18];
    out += kBase64[(v >> 12) & 63];
    out += kBase64[(v >> 6) & 63];
    out += kBase64[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    out += kBase64[v >> 18];
    out += kBase64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8;
    out += kBase64[v >> 18];
    out += kBase64[(v >> 12) & 63];
    out += kBase64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::optional<std::string> Base64Decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=') : 0;
    if (pad == 1 && in[i + 2] == '=') return std::nullopt;
    uint32_t v = 0;
    for (int j = 0; j < 4 - pad; ++j) {
      const int d = value(in[i + j]);
      if (d < 0) return std::nullopt;
      v |= uint32_t(d) << (18 - 6 * j);
    }
    out += char(v >> 16);
    if (pad < 2) out += char((v >> 8) & 0xff);
    if (pad < 1) out += char(v & 0xff);
  }
  return out;
}

// The gateway writes int64 fields as strings ("revision":"12") and leaves out those
// that are zero.
int64_t Int64(const json& object, std::string_view key) {
  const auto it = object.find(key);
  if (it == object.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (end != s.c_str() && *end == '\0') return v;
  }
  return 0;
}

Result<std::vector<KeyValue>> KeyValues(const json& range_response) {
  std::vector<KeyValue> out;
  const auto it = range_response.find("kvs");
  if (it == range_response.end()) return out;
  if (!it->is_array()) return Status::Corrupt("etcd: kvs is not a list");
  for (const json& kv : *it) {
    if (!kv.is_object()) return Status::Corrupt("etcd: a kvs entry is not an object");
    KeyValue v;
    auto key = Base64Decode(kv.value("key", ""));
    auto value = Base64Decode(kv.value("value", ""));
    if (!key || !value) return Status::Corrupt("etcd: a key or value is not base64");
    v.key = std::move(*key);
    v.value = std::move(*value);
    v.create_revision = Int64(kv, "create_revision");
    v.mod_revision = Int64(kv, "mod_revision");
    v.version = Int64(kv, "version");
    v.lease = Int64(kv, "lease");
    out.push_back(std::move(v));
  }
  return out;
}

json RangeRequest(std::string_view key, const RangeOptions& options) {
  json r = {{"key", Base64Encode(key)}};
  if (!options.range_end.empty()) r["range_end"] = Base64Encode(options.range_end);
  if (options.limit > 0) r["limit"] = std::to_string(options.limit);
  if (options.newest_first) {
    r["sort_order"] = "DESCEND";
    r["sort_target"] = "MOD";
  }
  if (options.keys_only) r["keys_only"] = true;
  return r;
}

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

// How one attempt at one endpoint ended.
enum class Attempt {
  kAnswered,  // an HTTP answer with a body
  kNotSent,   // could not connect (or finish TLS): nothing reached etcd
  kNoAnswer,  // sent, or perhaps sent, and no complete answer came back
};

// gRPC status codes the gateway puts in "code".
constexpr int kGrpcInvalidArgument = 3;
constexpr int kGrpcDeadlineExceeded = 4;
constexpr int kGrpcNotFound = 5;
constexpr int kGrpcPermissionDenied = 7;
constexpr int kGrpcFailedPrecondition = 9;
constexpr int kGrpcUnavailable = 14;
constexpr int kGrpcUnauthenticated = 16;

}  // namespace

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) != 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Result<EtcdOptions> EtcdOptionsFromConfig(const topology::CoordinationConfig& config) {
  EtcdOptions o;
  o.endpoints = config.endpoints;
  o.request_timeout = config.request_timeout;
  o.ca_file = config.ca_file;
  o.cert_file = config.cert_file;
  o.key_file = config.key_file;
  const char* user = std::getenv(topology::kEtcdUserEnv);
  const char* password = std::getenv(topology::kEtcdPasswordEnv);
  const bool has_user = user && *user;
  const bool has_password = password && *password;
  if (has_user != has_password) {
    return Status::InvalidArgument(
        std::string("etcd credentials: ") +
        (has_user ? topology::kEtcdUserEnv : topology::kEtcdPasswordEnv) + " is set but " +
        (has_user ? topology::kEtcdPasswordEnv : topology::kEtcdUserEnv) +
        " is not: set both or neither");
  }
  if (has_user) {
    o.user = user;
    o.password = password;
  }
  return o;
}

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  if (options.endpoints.empty()) return Status::InvalidArgument("etcd: no endpoints");
  for (const std::string& e : options.endpoints) {
    if (!e.starts_with("http://") && !e.starts_with("https://")) {
      return Status::InvalidArgument("etcd endpoint \"" + e + "\" is not an http(s) URL");
    }
  }
  if (options.request_timeout.count() <= 0) {
    return Status::InvalidArgument("etcd: request_timeout must be positive");
  }
  GlobalInit();
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options)));
}

namespace {

struct AttemptResult {
  Attempt how = Attempt::kNotSent;
  long http_status = 0;
  std::string body;
  std::string error;  // curl's, when not answered
};

AttemptResult Send(CURL* curl, const EtcdOptions& o, const std::string& url,
                   const std::string& body, const std::string& token) {
  AttemptResult r;
  curl_easy_reset(curl);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o.request_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(o.request_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r.body);
  if (!o.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, o.ca_file.c_str());
  if (!o.cert_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLCERT, o.cert_file.c_str());
  if (!o.key_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, o.key_file.c_str());
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
  const std::string auth = "Authorization: " + token;
  if (!token.empty()) headers = curl_slist_append(headers, auth.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  char error[CURL_ERROR_SIZE] = {};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
  if (rc == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.http_status);
    r.how = Attempt::kAnswered;
    return r;
  }
  r.error = error[0] ? error : curl_easy_strerror(rc);
  // Whether any byte of the request left: a connection refused, a name that does not
  // resolve or a TLS handshake that failed sent nothing; anything after the request
  // went out (a timeout waiting for the answer, a connection closed under it) may
  // have been acted on.
  long sent = 0;
  curl_easy_getinfo(curl, CURLINFO_REQUEST_SIZE, &sent);
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CIPHER:
      r.how = Attempt::kNotSent;
      break;
    default:
      r.how = sent > 0 ? Attempt::kNoAnswer : Attempt::kNotSent;
  }
  return r;
}

}  // namespace

struct EtcdClient::Impl {
  Mutex mu;
  std::vector<CURL*> idle GUARDED_BY(mu);  // easy handles keep their connections
  size_t preferred GUARDED_BY(mu) = 0;     // the endpoint that answered last
  std::string token GUARDED_BY(mu);        // empty: none yet (or no authentication)

  ~Impl() {
    for (CURL* c : idle) curl_easy_cleanup(c);
  }

  CURL* Take() {
    {
      MutexLock lock(mu);
      if (!idle.empty()) {
        CURL* c = idle.back();
        idle.pop_back();
        return c;
      }
    }
    return curl_easy_init();
  }
  void Give(CURL* c) {
    MutexLock lock(mu);
    idle.push_back(c);
  }

  // Sends `request` to `path`, trying endpoints from the one that answered last.
  // Returns the answer's JSON, or the error the header describes.
  Result<json> Call(const EtcdOptions& o, std::string_view path, const json& request);
};

EtcdClient::EtcdClient(EtcdOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

EtcdClient::~EtcdClient() = default;

Result<json> EtcdClient::Impl::Call(const EtcdOptions& o, std::string_view path,
                                    const json& request) {
  Impl& impl = *this;
  const std::string body = request.dump();
  const size_t n = o.endpoints.size();
  size_t first;
  std::string token;
  {
    MutexLock lock(impl.mu);
    first = impl.preferred % n;
    token = impl.token;
  }
  CURL* curl = impl.Take();
  if (!curl) return Status::Internal("etcd: curl_easy_init failed");
  std::string failures;  // per endpoint, for the message
  bool maybe_sent = false;
  bool reauthenticated = false;
  Result<json> outcome = Status::Unavailable("etcd: no endpoint");
  for (size_t i = 0; i < n; ++i) {
    const std::string& endpoint = o.endpoints[(first + i) % n];
    if (!o.user.empty() && token.empty()) {
      json auth = {{"name", o.user}, {"password", o.password}};
      AttemptResult a = Send(curl, o, endpoint + "/v3/auth/authenticate", auth.dump(), "");
      if (a.how != Attempt::kAnswered) {
        failures += "; " + endpoint + ": " + a.error;
        continue;  // authenticating writes nothing we care about
      }
      const json answer = json::parse(a.body, nullptr, false);
      if (answer.is_object() && answer.contains("token") && answer["token"].is_string()) {
        token = answer["token"].get<std::string>();
      } else if (answer.is_object() && Int64(answer, "code") == kGrpcFailedPrecondition) {
        // Authentication is not enabled: etcd takes requests without a token.
      } else {
        const std::string why =
            answer.is_object() ? answer.value("message", a.body) : std::string(a.body);
        impl.Give(curl);
        return Status::PermissionDenied("etcd at " + endpoint + " refused user \"" + o.user +
                                        "\": " + log::Escape(why));
      }
    }
    AttemptResult a = Send(curl, o, endpoint + std::string(path), body, token);
    if (a.how == Attempt::kNotSent) {
      failures += "; " + endpoint + ": " + a.error;
      continue;
    }
    if (a.how == Attempt::kNoAnswer) {
      maybe_sent = true;
      failures += "; " + endpoint + ": no answer (" + a.error + ")";
      continue;
    }
    // A streaming call (lease keepalive) answers one JSON object per line.
    const std::string first_line = a.body.substr(0, a.body.find('\n'));
    json answer = json::parse(first_line, nullptr, false);
    if (!answer.is_object()) {
      impl.Give(curl);
      if (a.http_status >= 400 && a.http_status < 500) {
        return Status::InvalidArgument("etcd at " + endpoint + " refused the request (HTTP " +
                                       std::to_string(a.http_status) +
                                       "): " + log::Escape(first_line.substr(0, 200)));
      }
      return Status::Corrupt("etcd at " + endpoint + " answered HTTP " +
                             std::to_string(a.http_status) +
                             " with no JSON: " + log::Escape(first_line.substr(0, 200)));
    }
    if (answer.contains("result") && answer["result"].is_object()) answer = answer["result"];
    if (!answer.contains("code") && !answer.contains("error") && a.http_status == 200) {
      {
        MutexLock lock(impl.mu);
        impl.preferred = (first + i) % n;
        if (!token.empty()) impl.token = token;
      }
      impl.Give(curl);
      return answer;
    }
    const int64_t code = Int64(answer, "code");
    const std::string message = log::Escape(
        answer.contains("message") && answer["message"].is_string()
            ? answer["message"].get<std::string>()
            : answer.value("error", std::string("HTTP ") + std::to_string(a.http_status)));
    if (code == kGrpcUnauthenticated && !o.user.empty() && !reauthenticated) {
      // The token expired or this member does not know it: get a fresh one and try
      // this endpoint again.
      reauthenticated = true;
      token.clear();
      --i;
      continue;
    }
    if (code == kGrpcUnavailable || code == kGrpcDeadlineExceeded) {
      // No leader, or etcd's own deadline: the request may still be applied.
      maybe_sent = true;
      failures += "; " + endpoint + ": " + message;
      continue;
    }
    impl.Give(curl);
    const std::string what = "etcd at " + endpoint + std::string(path) + ": " + message;
    // etcd with authentication enabled answers a request without a token "user name
    // is empty" (InvalidArgument): the credentials are missing.
    if (message.find("user name is empty") != std::string::npos) {
      return Status::PermissionDenied(what + " (etcd requires a user: set " +
                                      topology::kEtcdUserEnv + " and " +
                                      topology::kEtcdPasswordEnv + ")");
    }
    switch (code) {
      case kGrpcNotFound:
        return Status::NotFound(what);
      case kGrpcPermissionDenied:
      case kGrpcUnauthenticated:
        return Status::PermissionDenied(what);
      case kGrpcInvalidArgument:
        return Status::InvalidArgument(what);
      case kGrpcFailedPrecondition:
        return Status::FailedPrecondition(what);
      default:
        return Status::Internal(what + " (gRPC code " + std::to_string(code) + ")");
    }
  }
  impl.Give(curl);
  if (maybe_sent) {
    return Status::Timeout("etcd " + std::string(path) +
                           ": no answer, the request may or may not have taken effect" + failures);
  }
  return Status::Unavailable("etcd " + std::string(path) + ": no endpoint reachable, nothing sent" +
                             failures);
}

Result<std::vector<KeyValue>> EtcdClient::Range(std::string_view key, const RangeOptions& options) {
  ASSIGN_OR_RETURN(json answer, impl_->Call(options_, "/v3/kv/range", RangeRequest(key, options)));
  return KeyValues(answer);
}

Status EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  json r = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) r["lease"] = std::to_string(lease);
  return impl_->Call(options_, "/v3/kv/put", r).status();
}

Result<TxnResult> EtcdClient::Txn(const std::vector<std::string>& must_exist,
                                  const std::vector<std::string>& must_be_absent,
                                  const std::vector<TxnOp>& ops) {
  json compare = json::array();
  for (const std::string& k : must_exist) {
    compare.push_back({{"target", "CREATE"},
                       {"key", Base64Encode(k)},
                       {"result", "GREATER"},
                       {"create_revision", "0"}});
  }
  for (const std::string& k : must_be_absent) {
    compare.push_back({{"target", "CREATE"},
                       {"key", Base64Encode(k)},
                       {"result", "EQUAL"},
                       {"create_revision", "0"}});
  }
  json success = json::array();
  size_t ranges = 0;
  for (const TxnOp& op : ops) {
    switch (op.kind) {
      case TxnOp::Kind::kPut: {
        json put = {{"key", Base64Encode(op.key)}, {"value", Base64Encode(op.value)}};
        if (op.lease != 0) put["lease"] = std::to_string(op.lease);
        success.push_back({{"request_put", put}});
        break;
      }
      case TxnOp::Kind::kDelete: {
        json del = {{"key", Base64Encode(op.key)}};
        if (!op.range.range_end.empty()) del["range_end"] = Base64Encode(op.range.range_end);
        success.push_back({{"request_delete_range", del}});
        break;
      }
      case TxnOp::Kind::kRange:
        success.push_back({{"request_range", RangeRequest(op.key, op.range)}});
        ++ranges;
        break;
    }
  }
  json request = {{"compare", compare}, {"success", success}};
  ASSIGN_OR_RETURN(json answer, impl_->Call(options_, "/v3/kv/txn", request));
  TxnResult result;
  result.succeeded = answer.value("succeeded", false);
  if (!result.succeeded) return result;
  const auto responses = answer.find("responses");
  if (responses == answer.end() || !responses->is_array() || responses->size() != ops.size()) {
    return Status::Corrupt("etcd txn: " + std::to_string(ops.size()) +
                           " operations but a different number of responses");
  }
  for (const json& r : *responses) {
    const auto range = r.find("response_range");
    if (range == r.end()) continue;
    ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, KeyValues(*range));
    result.ranges.push_back(std::move(kvs));
  }
  if (result.ranges.size() != ranges) return Status::Corrupt("etcd txn: a range answer is missing");
  return result;
}

Result<std::optional<KeyValue>> EtcdClient::CreateIfAbsent(std::string_view key,
                                                           std::string_view value, int64_t lease) {
  const std::string k = Base64Encode(key);
  json put = {{"key", k}, {"value", Base64Encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  json request = {
      {"compare",
       json::array(
           {{{"target", "CREATE"}, {"key", k}, {"result", "EQUAL"}, {"create_revision", "0"}}})},
      {"success", json::array({{{"request_put", put}}})},
      {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
  ASSIGN_OR_RETURN(json answer, impl_->Call(options_, "/v3/kv/txn", request));
  if (answer.value("succeeded", false)) return std::optional<KeyValue>();
  const auto responses = answer.find("responses");
  if (responses == answer.end() || !responses->is_array() || responses->size() != 1 ||
      !(*responses)[0].contains("response_range")) {
    return Status::Corrupt("etcd txn on " + log::Escape(key) + ": failed without the key's range");
  }
  ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, KeyValues((*responses)[0]["response_range"]));
  if (kvs.empty()) {
    // Deleted between the compare and the range cannot happen inside one txn.
    return Status::Corrupt("etcd txn on " + log::Escape(key) + ": exists but has no value");
  }
  return std::optional<KeyValue>(std::move(kvs[0]));
}

Result<int64_t> EtcdClient::DeleteRange(std::string_view key, std::string_view range_end) {
  json r = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) r["range_end"] = Base64Encode(range_end);
  ASSIGN_OR_RETURN(json answer, impl_->Call(options_, "/v3/kv/deleterange", r));
  return Int64(answer, "deleted");
}

Result<int64_t> EtcdClient::LeaseGrant(int64_t ttl_seconds) {
  if (ttl_seconds < 1) return Status::InvalidArgument("etcd lease: ttl must be at least 1s");
  ASSIGN_OR_RETURN(json answer, impl_->Call(options_, "/v3/lease/grant",
                                            json{{"TTL", std::to_string(ttl_seconds)}}));
  const int64_t id = Int64(answer, "ID");
  if (id == 0) return Status::Corrupt("etcd lease grant: no ID in the answer");
  return id;
}

Result<int64_t> EtcdClient::LeaseKeepAlive(int64_t lease) {
  ASSIGN_OR_RETURN(json answer, impl_->Call(options_, "/v3/lease/keepalive",
                                            json{{"ID", std::to_string(lease)}}));
  const int64_t ttl = Int64(answer, "TTL");
  if (ttl <= 0) return Status::NotFound("etcd lease " + std::to_string(lease) + " has expired");
  return ttl;
}

Status EtcdClient::LeaseRevoke(int64_t lease) {
  auto answer = impl_->Call(options_, "/v3/lease/revoke", json{{"ID", std::to_string(lease)}});
  if (answer.status().code() == StatusCode::kNotFound) return Status::Ok();
  return answer.status();
}

}  // namespace deltacast::coord
