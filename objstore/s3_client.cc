#include "objstore/s3_client.h"

#include <curl/curl.h>
#include <fmt/core.h>
#include <openssl/sha.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "common/hash.h"
#include "common/thread_annotations.h"

namespace deltacast::objstore {

struct S3Client::Response {
  long http = 0;
  std::vector<std::byte> body;
  std::string xxh3;  // x-amz-meta-xxh3, if the object has one
  uint64_t content_length = 0;
  bool has_content_length = false;
};

namespace {

constexpr std::string_view kHashHeader = "x-amz-meta-xxh3";

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<S3Client::Response*>(user);
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  r->body.insert(r->body.end(), bytes, bytes + size * n);
  return size * n;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' '))
    s.remove_suffix(1);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  return s;
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  }
  return true;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<S3Client::Response*>(user);
  std::string_view line(data, size * n);
  if (StartsWithNoCase(line, "http/")) {  // a new response (after a redirect or 100)
    r->xxh3.clear();
    r->has_content_length = false;
  } else if (StartsWithNoCase(line, kHashHeader) && line.size() > kHashHeader.size() &&
             line[kHashHeader.size()] == ':') {
    r->xxh3 = std::string(Trim(line.substr(kHashHeader.size() + 1)));
  } else if (StartsWithNoCase(line, "content-length:")) {
    r->content_length = std::strtoull(std::string(Trim(line.substr(15))).c_str(), nullptr, 10);
    r->has_content_length = true;
  }
  return size * n;
}

// The text of the first <tag>...</tag> in `xml` at or after `from`; npos-safe.
std::string_view XmlField(std::string_view xml, std::string_view tag, size_t* from = nullptr) {
  const std::string open = fmt::format("<{}>", tag), close = fmt::format("</{}>", tag);
  const size_t start = xml.find(open, from ? *from : 0);
  if (start == std::string_view::npos) return {};
  const size_t begin = start + open.size();
  const size_t end = xml.find(close, begin);
  if (end == std::string_view::npos) return {};
  if (from) *from = end + close.size();
  return xml.substr(begin, end - begin);
}

std::string XmlUnescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    static constexpr std::pair<std::string_view, char> kEntities[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    bool matched = false;
    for (const auto& [entity, c] : kEntities) {
      if (s.substr(i, entity.size()) == entity) {
        out += c;
        i += entity.size() - 1;
        matched = true;
        break;
      }
    }
    if (!matched) out += '&';
  }
  return out;
}

std::string HashHex(ByteSpan body) { return fmt::format("{:016x}", Hash64(body)); }

// The payload hash SigV4 signs (x-amz-content-sha256): libcurl 7.88 signs the
// header's value but neither computes nor adds it, and S3 requires it.
std::string PayloadHashHeader(ByteSpan body) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(body.data()), body.size(), digest);
  std::string out = "x-amz-content-sha256: ";
  for (unsigned char c : digest) out += fmt::format("{:02x}", c);
  return out;
}

// The Status for a non-2xx answer: its code and the server's <Code> element.
Status HttpError(std::string_view method, std::string_view key, const S3Client::Response& r) {
  std::string code(XmlField(AsChars(r.body), "Code"));
  const std::string what =
      fmt::format("S3 {} '{}': HTTP {}{}{}", method, key, r.http, code.empty() ? "" : " ", code);
  if (r.http == 404) return Status::NotFound(what);
  if (r.http == 403) return Status::PermissionDenied(what);
  if (r.http >= 500 || r.http == 429) return Status::Unavailable(what);
  return Status::InvalidArgument(what);
}

}  // namespace

Result<std::unique_ptr<S3Client>> S3Client::Create(S3Options options) {
  if (options.endpoint.empty()) return Status::InvalidArgument("S3: no endpoint given");
  if (!options.endpoint.starts_with("http://") && !options.endpoint.starts_with("https://")) {
    return Status::InvalidArgument("S3: endpoint '" + options.endpoint +
                                   "' must start with http:// or https://");
  }
  if (options.bucket.empty()) return Status::InvalidArgument("S3: no bucket given");
  while (options.endpoint.ends_with('/')) options.endpoint.pop_back();
  GlobalInit();
  return std::unique_ptr<S3Client>(new S3Client(std::move(options)));
}

S3Client::~S3Client() {
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* S3Client::TakeHandle() {
  {
    MutexLock lock(mu_);
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      curl_easy_reset(static_cast<CURL*>(h));
      return h;
    }
  }
  return curl_easy_init();
}

void S3Client::ReturnHandle(void* handle) {
  MutexLock lock(mu_);
  idle_.push_back(handle);
}

std::string S3Client::UrlFor(std::string_view key, std::string_view query) const {
  // Each path segment percent-encoded; '/' kept, as S3 keys use it as a separator.
  std::string url = options_.endpoint + "/" + options_.bucket;
  if (!key.empty()) url += "/";
  size_t start = 0;
  while (start <= key.size() && !key.empty()) {
    const size_t slash = key.find('/', start);
    const std::string_view segment =
        key.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    char* escaped = curl_easy_escape(nullptr, segment.data(), static_cast<int>(segment.size()));
    url += escaped;
    curl_free(escaped);
    if (slash == std::string_view::npos) break;
    url += '/';
    start = slash + 1;
  }
  if (!query.empty()) url += "?" + std::string(query);
  return url;
}

Status S3Client::Perform(std::string_view method, std::string_view key, std::string_view query,
                         ByteSpan body, Response& response) {
  CURL* curl = static_cast<CURL*>(TakeHandle());
  if (!curl) return Status::Internal("S3: curl_easy_init failed");
  const std::string url = UrlFor(key, query);
  const std::string sigv4 = "aws:amz:" + options_.region + ":s3";
  const std::string userpwd = options_.access_key + ":" + options_.secret_key;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(curl, CURLOPT_USERPWD, userpwd.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options_.connect_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.request_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                   std::max(1L, static_cast<long>((options_.stall_timeout.count() + 999) / 1000)));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &response);
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  const std::string payload_header = PayloadHashHeader(body);
  curl_slist* headers = curl_slist_append(nullptr, payload_header.c_str());
  std::string hash_header;
  if (method == "PUT") {
    // POSTFIELDS lets curl hash the payload into the signature (x-amz-content-sha256).
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "PUT");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS,
                     body.empty() ? "" : reinterpret_cast<const char*>(body.data()));
    headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
    headers = curl_slist_append(headers, "Expect:");
    if (!key.empty()) {
      hash_header = std::string(kHashHeader) + ": " + HashHex(body);
      headers = curl_slist_append(headers, hash_header.c_str());
    }
  } else if (method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, std::string(method).c_str());
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.http);
  Count(method, key, response.http);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    // A connection that broke leaves the handle's state unknown: drop it.
    curl_easy_cleanup(curl);
    const std::string what =
        fmt::format("S3 {} '{}' at {}: {}", method, key, options_.endpoint, curl_easy_strerror(rc));
    if (rc == CURLE_PARTIAL_FILE) return Status::Corrupt(what + " (object cut short)");
    if (rc == CURLE_OPERATION_TIMEDOUT) return Status::Timeout(what);
    return Status::Unavailable(what);
  }
  ReturnHandle(curl);
  return Status::Ok();
}

void S3Client::Count(std::string_view method, std::string_view key, long http) {
  MutexLock lock(counts_mu_);
  if (method == "GET" && key.empty()) {
    ++counts_.list;
  } else if (method == "GET") {
    ++counts_.get;
    if (http == 404) ++counts_.get_missing;
  } else if (method == "PUT") {
    ++counts_.put;
  } else if (method == "HEAD") {
    ++counts_.head;
  } else if (method == "DELETE") {
    ++counts_.del;
  }
}

RequestCounts S3Client::requests() const {
  MutexLock lock(counts_mu_);
  return counts_;
}

std::string RequestCounts::ToString() const {
  return fmt::format("get={} get_missing={} put={} list={} head={} delete={} total={}", get,
                     get_missing, put, list, head, del, Total());
}

Status S3Client::CreateBucket() {
  Response r;
  RETURN_IF_ERROR(Perform("PUT", "", "", {}, r));
  if (r.http / 100 == 2) return Status::Ok();
  const std::string_view code = XmlField(AsChars(r.body), "Code");
  if (r.http == 409 && code == "BucketAlreadyOwnedByYou") return Status::Ok();
  return HttpError("CreateBucket", options_.bucket, r);
}

Status S3Client::Put(std::string_view key, ByteSpan body) {
  Response r;
  RETURN_IF_ERROR(Perform("PUT", key, "", body, r));
  if (r.http / 100 != 2) return HttpError("PUT", key, r);
  return Status::Ok();
}

Result<std::vector<std::byte>> S3Client::Get(std::string_view key) {
  Response r;
  RETURN_IF_ERROR(Perform("GET", key, "", {}, r));
  if (r.http / 100 != 2) return HttpError("GET", key, r);
  if (r.has_content_length && r.content_length != r.body.size()) {
    return Status::Corrupt(fmt::format("S3 GET '{}': {} bytes of {} (object cut short)", key,
                                       r.body.size(), r.content_length));
  }
  if (r.xxh3.empty()) {
    // Every PUT of ours carries it. A server whose PUT is not atomic (s3rver writes
    // the body, then the metadata) serves an object being written without it, cut
    // anywhere: not whole yet, or not written by deltacast.
    return Status::Corrupt(fmt::format(
        "S3 GET '{}': {} bytes without their {} (object still being written, or not written by "
        "deltacast)",
        key, r.body.size(), kHashHeader));
  }
  if (r.xxh3 != HashHex(r.body)) {
    return Status::Corrupt(fmt::format(
        "S3 GET '{}': the {} bytes read do not hash to the {} it was written with (object "
        "truncated or damaged)",
        key, r.body.size(), r.xxh3));
  }
  return std::move(r.body);
}

Result<uint64_t> S3Client::Head(std::string_view key) {
  Response r;
  RETURN_IF_ERROR(Perform("HEAD", key, "", {}, r));
  if (r.http / 100 != 2) return HttpError("HEAD", key, r);
  if (!r.has_content_length) {
    return Status::Corrupt(fmt::format("S3 HEAD '{}': no Content-Length", key));
  }
  return r.content_length;
}

Status S3Client::Delete(std::string_view key) {
  Response r;
  RETURN_IF_ERROR(Perform("DELETE", key, "", {}, r));
  if (r.http / 100 != 2 && r.http != 404) return HttpError("DELETE", key, r);
  return Status::Ok();
}

// ListObjects (version 1) paged by marker = the last key seen: every S3-compatible
// server has it (s3rver's ListObjectsV2 continuation tokens need a cipher that
// OpenSSL 3 no longer offers).
Result<std::vector<ObjectInfo>> S3Client::List(std::string_view prefix) {
  std::vector<ObjectInfo> out;
  auto escape = [](std::string_view s) {
    char* e = curl_easy_escape(nullptr, s.data(), static_cast<int>(s.size()));
    std::string r(e);
    curl_free(e);
    return r;
  };
  for (;;) {
    std::string query;
    if (!out.empty()) query = "marker=" + escape(out.back().key) + "&";
    query += "prefix=" + escape(prefix);
    Response r;
    RETURN_IF_ERROR(Perform("GET", "", query, {}, r));
    if (r.http / 100 != 2) return HttpError("LIST", prefix, r);
    const std::string_view xml = AsChars(r.body);
    size_t at = 0;
    const size_t before = out.size();
    for (;;) {
      std::string_view contents = XmlField(xml, "Contents", &at);
      if (contents.empty()) break;
      ObjectInfo info;
      info.key = XmlUnescape(XmlField(contents, "Key"));
      info.size = std::strtoull(std::string(XmlField(contents, "Size")).c_str(), nullptr, 10);
      out.push_back(std::move(info));
    }
    if (XmlField(xml, "IsTruncated") != "true") break;
    if (out.size() == before) {
      return Status::Corrupt("S3 LIST '" + std::string(prefix) +
                             "': a truncated listing with no objects in it");
    }
  }
  return out;
}

std::vector<Result<std::vector<std::byte>>> S3Client::GetMany(std::span<const std::string> keys,
                                                              size_t parallel) {
  std::vector<Result<std::vector<std::byte>>> results(
      keys.size(), Result<std::vector<std::byte>>(Status::Internal("not fetched")));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < keys.size(); i = next++) results[i] = Get(keys[i]);
  };
  std::vector<std::thread> threads;
  const size_t n = std::min(std::max<size_t>(parallel, 1), keys.size());
  for (size_t i = 1; i < n; ++i) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace deltacast::objstore
