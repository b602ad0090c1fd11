// S3Client: the few S3 calls the object-store path needs (PUT, GET, HEAD, DELETE,
// ListObjectsV2, CreateBucket) against one bucket of an S3-compatible server, over
// libcurl, which signs every request with AWS SigV4 (CURLOPT_AWS_SIGV4): nothing
// here computes a signature. Path-style URLs (endpoint/bucket/key), so any
// S3-compatible server works without DNS for the bucket.
//
// Every PUT carries the body's xxh3-64 as user metadata (x-amz-meta-xxh3), and a GET
// checks the body against it: an object truncated or damaged at rest, or one without
// the hash (still being written on a server whose PUT is not atomic, or not ours),
// reads as kCorrupt, never as short data (docs/object-store.md).
//
// Errors: kNotFound for a missing object (404), kPermissionDenied for 403,
// kUnavailable for a server that cannot be reached, broke the connection, or
// answered 5xx (worth retrying), kCorrupt for a body that is short or fails its
// hash, kInvalidArgument for any other 4xx; each message names the key and the
// server's error code.
//
// Thread safety: every method is thread-safe and blocks the calling thread for one
// request (GetMany: for all of them). Connections are kept and reused across calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace deltacast::objstore {

struct S3Options {
  std::string endpoint;  // "http://127.0.0.1:4568" (https works too)
  std::string bucket;
  std::string region = "us-east-1";  // the SigV4 signing region
  std::string access_key;
  std::string secret_key;
  std::chrono::milliseconds connect_timeout{5000};
  // The whole request, connecting included.
  std::chrono::milliseconds request_timeout{60000};
  // A transfer that moves no byte for this long is abandoned (kTimeout): a server
  // that stalls mid-body (s3rver does while the object is being overwritten) costs
  // this, not the whole request timeout.
  std::chrono::milliseconds stall_timeout{1000};
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

// Requests sent, by kind; every attempt counts, a retry too (a provider bills each).
// On AWS S3 a PUT or LIST costs about 12 GETs; a GET answered 404 costs a GET.
struct RequestCounts {
  uint64_t get = 0;          // GETs of one object, 404s included
  uint64_t get_missing = 0;  // of those, answered 404 (a poll that found nothing)
  uint64_t put = 0;
  uint64_t list = 0;  // pages of a listing
  uint64_t head = 0;
  uint64_t del = 0;
  uint64_t Total() const { return get + put + list + head + del; }
  RequestCounts operator-(const RequestCounts& o) const {
    return {get - o.get, get_missing - o.get_missing, put - o.put, list - o.list, head - o.head,
            del - o.del};
  }
  // "get=3 get_missing=1 put=2 list=0 head=0 delete=0 total=5"
  std::string ToString() const;
};

class S3Client {
 public:
  // kInvalidArgument for an empty endpoint or bucket, or an endpoint without
  // http:// or https://. Connects to nothing yet.
  static Result<std::unique_ptr<S3Client>> Create(S3Options options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // Creates the bucket; OK if this account already owns it.
  Status CreateBucket();
  // Writes `body` as `key` in one PUT (visible to readers only once complete).
  Status Put(std::string_view key, ByteSpan body);
  // The whole object.
  Result<std::vector<std::byte>> Get(std::string_view key);
  // The object's size.
  Result<uint64_t> Head(std::string_view key);
  // OK also when the object does not exist.
  Status Delete(std::string_view key);
  // Every object whose key starts with `prefix`, in key order (all pages).
  Result<std::vector<ObjectInfo>> List(std::string_view prefix);
  // GETs `keys` with up to `parallel` requests in flight; results in `keys` order.
  std::vector<Result<std::vector<std::byte>>> GetMany(std::span<const std::string> keys,
                                                      size_t parallel);

  const S3Options& options() const { return options_; }
  // Every request this client has sent so far.
  RequestCounts requests() const;

  struct Response;  // private to s3_client.cc

 private:
  explicit S3Client(S3Options options) : options_(std::move(options)) {}
  // One request; `body` is sent for PUT. Fills `response`; fails only when no HTTP
  // answer came.
  Status Perform(std::string_view method, std::string_view key, std::string_view query,
                 ByteSpan body, Response& response);
  std::string UrlFor(std::string_view key, std::string_view query) const;
  void* TakeHandle();
  void ReturnHandle(void* handle);

  void Count(std::string_view method, std::string_view key, long http);

  const S3Options options_;
  Mutex mu_;
  std::vector<void*> idle_ GUARDED_BY(mu_);  // CURL* handles kept for their connections
  mutable Mutex counts_mu_;
  RequestCounts counts_ GUARDED_BY(counts_mu_);
};

}  // namespace deltacast::objstore
