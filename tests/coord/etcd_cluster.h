// EtcdCluster: a real etcd cluster (Debian's etcd-server, /usr/bin/etcd; scripts/setup
// installs it) of one or more members on 127.0.0.1 for a test: free ports, each
// member's log in the folder the test owns, its data in a folder on /dev/shm (where
// there is one: etcd fsyncs every write, and a loaded machine's disk stalls fsync for
// seconds, long enough to lose the leader), removed with the object. Short heartbeat
// and election times, so a leader is elected within about a second after a member is
// lost. Members are killed with SIGKILL (a crash) and restarted on
// their ports and data; a member dies with the test process (PR_SET_PDEATHSIG).
//
// Available() is false without /usr/bin/etcd; tests then GTEST_SKIP with kSkipMessage.
// tests/coord/etcd_lib.sh does the same for shell tests.
//
// Thread safety: one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace deltacast::test_util {

class EtcdCluster {
 public:
  static constexpr const char* kSkipMessage =
      "etcd is not installed (scripts/setup installs etcd-server): etcd test skipped";
  static constexpr const char* kEtcd = "/usr/bin/etcd";
  static bool Available();

  // TLS on the client port: etcd serves https with `cert`/`key` (which `ca` signed);
  // with `client_ca` set it also demands client certificates that CA signed
  // (--client-cert-auth), and the health check presents client_cert/client_key.
  struct Tls {
    std::filesystem::path cert;
    std::filesystem::path key;
    std::filesystem::path ca;
    std::filesystem::path client_ca;
    std::filesystem::path client_cert;
    std::filesystem::path client_key;
  };

  // `flags` go to every member after the harness's own (e.g. "--auth-token-ttl=1").
  EtcdCluster(std::filesystem::path dir, int members, Tls tls = {},
              std::vector<std::string> flags = {});
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Starts every member and waits until each answers /health (a leader exists);
  // false (after printing the members' log tails) if not within 20 s.
  bool Start();
  // SIGKILL one member and reap it; its data stays.
  void Kill(int member);
  // Starts a killed member again on its ports and data and waits until it is healthy.
  bool Restart(int member);
  void KillAll();
  // Restarts every member that is down and waits until all are healthy.
  bool RestartAll();
  // Every running member answers /health with a leader, within `timeout`.
  bool WaitHealthy(std::chrono::milliseconds timeout);

  // Client URLs, in member order.
  std::vector<std::string> endpoints() const;
  std::string endpoint(int member) const;
  bool running(int member) const { return members_[static_cast<size_t>(member)].pid > 0; }
  int size() const { return static_cast<int>(members_.size()); }
  // POSTs `body` (JSON) to `path` on one member's gateway, as etcdctl would (with the
  // TLS client files, and `token` as Authorization when set); the answer's body, or
  // curl's error text when none came.
  std::string Post(int member, const std::string& path, const std::string& body,
                   const std::string& token = "") const;
  // The last lines of each member's log, for a failure message.
  std::string LogTails(size_t lines = 15) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };
  bool Spawn(size_t member);
  std::string Scheme() const { return tls_.cert.empty() ? "http" : "https"; }

  std::filesystem::path dir_;
  std::filesystem::path data_dir_;  // the members' data: on /dev/shm, else dir_
  Tls tls_;
  std::vector<Member> members_;
  std::string initial_cluster_;
  std::vector<std::string> flags_;
};

}  // namespace deltacast::test_util
