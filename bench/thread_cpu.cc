#include "bench/thread_cpu.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace deltacast::bench {
namespace {

// utime + stime of a /proc/.../stat line, in seconds (fields 14 and 15, counted
// after the parenthesised name, which may itself hold spaces).
double StatCpuSeconds(const std::string& stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);
  }
  return ticks / double(::sysconf(_SC_CLK_TCK));
}

std::string ReadLine(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

ThreadSample SampleThreads(pid_t pid) {
  ThreadSample sample;
  const std::filesystem::path proc = "/proc/" + std::to_string(pid);
  const std::string stat = ReadLine(proc / "stat");
  if (stat.empty()) return sample;
  sample.process_cpu_seconds = StatCpuSeconds(stat);
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(proc / "task", ec)) {
    pid_t tid = 0;
    try {
      tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    } catch (const std::exception&) {
      continue;
    }
    ThreadSample::Thread thread;
    thread.name = ReadLine(task.path() / "comm");
    if (thread.name.empty()) continue;  // it ended meanwhile
    // schedstat: nanoseconds on a CPU first; finer than stat's clock ticks.
    std::istringstream schedstat(ReadLine(task.path() / "schedstat"));
    double ns = 0;
    if (schedstat >> ns) {
      thread.cpu_seconds = ns * 1e-9;
    } else {
      thread.cpu_seconds = StatCpuSeconds(ReadLine(task.path() / "stat"));
    }
    sample.threads[tid] = thread;
  }
  sample.ok = !sample.threads.empty();
  return sample;
}

std::map<std::string, double> CpuByName(const ThreadSample& before, const ThreadSample& after) {
  std::map<std::string, double> by_name;
  for (const auto& [tid, thread] : after.threads) {
    auto it = before.threads.find(tid);
    const double start = it == before.threads.end() ? 0 : it->second.cpu_seconds;
    by_name[thread.name] += thread.cpu_seconds - start;
  }
  return by_name;
}

}  // namespace deltacast::bench
