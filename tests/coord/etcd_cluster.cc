#include "tests/coord/etcd_cluster.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace deltacast::test_util {
namespace {

// Loopback ports nobody listens on right now (bound to 0, then released).
std::vector<int> FreePorts(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ports.push_back(ntohs(a.sin_port));
    fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

size_t Collect(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// GET (post empty) or POST `url`; the answer's body, or curl's error text.
std::string Fetch(const std::string& url, const EtcdCluster::Tls& tls, const std::string& post,
                  const std::string& token) {
  CURL* curl = curl_easy_init();
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 2000L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  if (!post.empty()) curl_easy_setopt(curl, CURLOPT_POSTFIELDS, post.c_str());
  curl_slist* headers = nullptr;
  const std::string auth = "Authorization: " + token;
  if (!token.empty()) headers = curl_slist_append(headers, auth.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (!tls.ca.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, tls.ca.c_str());
  if (!tls.client_cert.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLCERT, tls.client_cert.c_str());
    curl_easy_setopt(curl, CURLOPT_SSLKEY, tls.client_key.c_str());
  }
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return rc == CURLE_OK ? body : std::string("curl: ") + curl_easy_strerror(rc);
}

// GET <url>/health: {"health":"true"} once the member sees a leader.
bool Healthy(const std::string& url, const EtcdCluster::Tls& tls) {
  return Fetch(url + "/health", tls, "", "").find("\"health\":\"true\"") != std::string::npos;
}

}  // namespace

bool EtcdCluster::Available() { return ::access(kEtcd, X_OK) == 0; }

EtcdCluster::EtcdCluster(std::filesystem::path dir, int members, Tls tls,
                         std::vector<std::string> flags)
    : dir_(std::move(dir)), tls_(std::move(tls)), flags_(std::move(flags)) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  std::string shm = "/dev/shm/deltacast-etcd.XXXXXX";
  data_dir_ =
      ::access("/dev/shm", W_OK) == 0 && ::mkdtemp(shm.data()) ? std::filesystem::path(shm) : dir_;
  const std::vector<int> ports = FreePorts(2 * members);
  for (int i = 0; i < members; ++i) {
    Member m;
    m.name = "m" + std::to_string(i);
    m.client_port = ports[static_cast<size_t>(2 * i)];
    m.peer_port = ports[static_cast<size_t>(2 * i + 1)];
    if (!initial_cluster_.empty()) initial_cluster_ += ",";
    initial_cluster_ += m.name + "=http://127.0.0.1:" + std::to_string(m.peer_port);
    members_.push_back(m);
  }
}

EtcdCluster::~EtcdCluster() {
  KillAll();
  std::error_code ec;
  if (data_dir_ != dir_) std::filesystem::remove_all(data_dir_, ec);
}

std::string EtcdCluster::endpoint(int member) const {
  return Scheme() +
         "://127.0.0.1:" + std::to_string(members_[static_cast<size_t>(member)].client_port);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
  return out;
}

bool EtcdCluster::Spawn(size_t i) {
  Member& m = members_[i];
  std::filesystem::create_directories(dir_);
  const std::string data = (data_dir_ / (m.name + ".data")).string();
  const std::string log = (dir_ / (m.name + ".log")).string();
  const std::string client = endpoint(static_cast<int>(i));
  const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
  std::vector<std::string> args = {
      kEtcd,
      "--name=" + m.name,
      "--data-dir=" + data,
      "--listen-client-urls=" + client,
      "--advertise-client-urls=" + client,
      "--listen-peer-urls=" + peer,
      "--initial-advertise-peer-urls=" + peer,
      "--initial-cluster=" + initial_cluster_,
      "--initial-cluster-state=new",
      "--initial-cluster-token=deltacast-test",
      // Elections within about a second; leases as short as a second.
      "--heartbeat-interval=50",
      "--election-timeout=500",
      "--snapshot-count=10000",
      "--quota-backend-bytes=67108864",
      "--log-level=warn",
      "--logger=zap",
  };
  if (!tls_.cert.empty()) {
    args.push_back("--cert-file=" + tls_.cert.string());
    args.push_back("--key-file=" + tls_.key.string());
    if (!tls_.client_ca.empty()) {
      args.push_back("--client-cert-auth");
      args.push_back("--trusted-ca-file=" + tls_.client_ca.string());
    }
  }
  args.insert(args.end(), flags_.begin(), flags_.end());
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(kEtcd, argv.data());
    ::_exit(127);
  }
  m.pid = pid;
  return true;
}

bool EtcdCluster::Start() {
  for (size_t i = 0; i < members_.size(); ++i) {
    if (members_[i].pid <= 0 && !Spawn(i)) return false;
  }
  if (WaitHealthy(std::chrono::seconds(20))) return true;
  std::cerr << "etcd did not become healthy:\n" << LogTails();
  return false;
}

void EtcdCluster::Kill(int member) {
  Member& m = members_[static_cast<size_t>(member)];
  if (m.pid <= 0) return;
  ::kill(m.pid, SIGKILL);
  int status = 0;
  ::waitpid(m.pid, &status, 0);
  m.pid = -1;
}

bool EtcdCluster::Restart(int member) {
  if (members_[static_cast<size_t>(member)].pid <= 0 && !Spawn(static_cast<size_t>(member))) {
    return false;
  }
  if (WaitHealthy(std::chrono::seconds(20))) return true;
  std::cerr << "etcd member " << member << " did not come back:\n" << LogTails();
  return false;
}

void EtcdCluster::KillAll() {
  for (int i = 0; i < size(); ++i) Kill(i);
}

bool EtcdCluster::RestartAll() { return Start(); }

bool EtcdCluster::WaitHealthy(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    bool all = true;
    for (int i = 0; i < size() && all; ++i) {
      Member& m = members_[static_cast<size_t>(i)];
      if (m.pid <= 0) continue;
      int status = 0;
      if (::waitpid(m.pid, &status, WNOHANG) == m.pid) {
        std::cerr << "etcd member " << i << " exited (status " << status << ")\n";
        m.pid = -1;
        return false;
      }
      all = Healthy(endpoint(i), tls_);
    }
    if (all) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string EtcdCluster::Post(int member, const std::string& path, const std::string& body,
                              const std::string& token) const {
  return Fetch(endpoint(member) + path, tls_, body.empty() ? "{}" : body, token);
}

std::string EtcdCluster::LogTails(size_t lines) const {
  std::string out;
  for (const Member& m : members_) {
    std::ifstream in(dir_ / (m.name + ".log"));
    std::vector<std::string> all;
    for (std::string line; std::getline(in, line);) all.push_back(line);
    out += "--- " + m.name + ".log\n";
    for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
      out += all[i] + "\n";
    }
  }
  return out;
}

}  // namespace deltacast::test_util
