// Staged apply through the public API (docs/serving.md): a node serving from its
// weights holds a verified delta while the refit streams, writes it only at COMMIT
// between its engine's pause and resume hooks, and leaves the weights untouched when
// the refit aborts or the engine does not pause. Links to libdeltacast.so alone.
#include <deltacast/deltacast.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "api_fixture.h"

namespace {

using deltacast::apitest::Model;
using deltacast::apitest::Toml;

using std::chrono::milliseconds;
using ::testing::HasSubstr;

int BasePort() { return 25202 + static_cast<int>(::getpid() % 300) * 10; }

// What an engine saw through its hooks.
struct EngineLog {
  std::mutex mu;
  int pauses = 0, resumes = 0;
  bool paused = false;
  // The weights as they were when each pause began (the staged node must not have
  // written a byte before it).
  std::vector<std::vector<std::vector<std::byte>>> at_pause;
};

// Waits (at most 3 s) until `log`'s engine has been resumed `resumes` times: the
// resume hook runs on the node's hook thread, after the commit is reported.
void WaitForResumes(EngineLog& log, int resumes) {
  for (int i = 0; i < 150; ++i) {
    {
      std::lock_guard lock(log.mu);
      if (log.resumes >= resumes) return;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
}

struct Cluster {
  deltacast::Config config;
  std::vector<std::unique_ptr<deltacast::Node>> nodes;

  Cluster() : config(*deltacast::Config::Parse(Toml("staged", BasePort()), "staged.toml")) {
    deltacast::SetLogLevel(getenv("STAGED_LOG") ? deltacast::LogLevel::kInfo
                                                : deltacast::LogLevel::kOff);
  }
  // Node `id` over `weights`, staged with hooks that log into `log`; `pause` (if
  // given) decides what the pause hook returns.
  deltacast::Node& Start(const std::string& id, Model& weights, EngineLog* log,
                         std::function<deltacast::Status()> pause = {},
                         const std::string& mode = "staged") {
    deltacast::NodeOptions options;
    options.node_id = id;
    options.token = "t";
    options.apply_threads = 1;
    options.apply_mode = mode;
    options.hook_timeout = milliseconds(500);
    if (log) {
      options.pause_engine = [log, &weights, pause]() -> deltacast::Status {
        if (pause) {
          deltacast::Status s = pause();
          if (!s.ok()) return s;
        }
        std::lock_guard lock(log->mu);
        EXPECT_FALSE(log->paused) << "paused twice";
        log->paused = true;
        ++log->pauses;
        log->at_pause.push_back(weights.bytes);
        return deltacast::Status::Ok();
      };
      options.resume_engine = [log] {
        std::lock_guard lock(log->mu);
        log->paused = false;
        ++log->resumes;
      };
    }
    auto node = deltacast::Node::Start(config, options, weights.Views());
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    nodes.push_back(std::move(*node));
    return *nodes.back();
  }
  std::unique_ptr<deltacast::Source> Source() {
    deltacast::SourceOptions options;
    options.token = "t";
    auto source = deltacast::Source::Start(config, options);
    EXPECT_TRUE(source.ok()) << source.status().ToString();
    return std::move(*source);
  }
};

// ~3 % of bytes change.
Model Step(const Model& from, uint32_t seed) {
  Model to = from;
  std::mt19937 rng(seed);
  for (auto& tensor : to.bytes) {
    for (auto& b : tensor) {
      if (rng() % 33 == 0) b ^= std::byte(1 + rng() % 255);
    }
  }
  return to;
}

TEST(ApiStaged, TheEngineStopsOnlyForTheWriteAndEveryRefitLandsBitExact) {
  Cluster cluster;
  Model trainer(7);
  Model w1 = trainer, w2 = trainer;
  EngineLog staged, arrival;
  auto source = cluster.Source();
  deltacast::Node& n1 = cluster.Start("w1", w1, &staged);
  deltacast::Node& n2 = cluster.Start("w2", w2, &arrival, {}, "on-arrival");
  ASSERT_TRUE(n1.WaitForJoin(milliseconds(10000)).ok());
  ASSERT_TRUE(n2.WaitForJoin(milliseconds(10000)).ok());
  for (uint32_t step = 1; step <= 3; ++step) {
    Model base = trainer;
    trainer = Step(trainer, 100 + step);
    auto report = source->Publish(base.Views(), trainer.Views());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_TRUE(report->committed) << report->abort_reason;
    EXPECT_EQ(w1.bytes, trainer.bytes) << "step " << step;
    EXPECT_EQ(w2.bytes, trainer.bytes) << "step " << step;
    // Both pauses reach the source's report (COMMITTED carries them up).
    ASSERT_EQ(report->nodes.size(), 2u);
    for (const deltacast::NodeReport& n : report->nodes) {
      EXPECT_GT(n.pause_seconds, 0) << n.node;
      EXPECT_GT(n.prepared_hold_seconds, 0) << n.node;
    }
    std::lock_guard lock(staged.mu);
    // One pause per refit, and nothing had been written when it began.
    ASSERT_EQ(staged.pauses, static_cast<int>(step));
    EXPECT_EQ(staged.at_pause.back(), base.bytes) << "the staged node wrote before COMMIT";
    EXPECT_GT(n1.stats().last_pause_seconds, 0);
    EXPECT_GT(n1.stats().last_prepared_hold_seconds, 0);
    // On arrival, the engine is paused from the first write to the commit.
    EXPECT_EQ(arrival.pauses, static_cast<int>(step));
    EXPECT_GT(n2.stats().last_pause_seconds, 0);
  }
  WaitForResumes(staged, 3);
  WaitForResumes(arrival, 3);
  EXPECT_EQ(staged.resumes, 3);
  EXPECT_EQ(arrival.resumes, 3);
  auto audit = n1.Verify();
  ASSERT_TRUE(audit.ok()) << audit.status().ToString();
  EXPECT_TRUE(audit->ok()) << audit->summary;
  source->Stop();
}

TEST(ApiStaged, AnAbortedRefitNeverTouchesTheWeightsNorPausesTheEngine) {
  Cluster cluster;
  Model trainer(8);
  Model w1 = trainer;
  Model w2 = trainer;
  w2.bytes[1][5] ^= std::byte{0x20};  // not the cluster's version: w2 fails the refit
  EngineLog staged;
  auto source = cluster.Source();
  deltacast::Node& n1 = cluster.Start("w1", w1, &staged);
  cluster.Start("w2", w2, nullptr, {}, "on-arrival");
  ASSERT_TRUE(n1.WaitForJoin(milliseconds(10000)).ok());
  Model target = Step(trainer, 9);
  auto report = source->Publish(trainer.Views(), target.Views());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->committed);
  EXPECT_EQ(w1.bytes, trainer.bytes);
  EXPECT_EQ(staged.pauses, 0);
  EXPECT_EQ(n1.stats().refits_aborted, 1u);
  EXPECT_EQ(n1.stats().version, source->version());
  source->Stop();
}

// A pause that fails, or does not return in time: nothing is written, the node says
// it could not commit, and it reaches the version at the next refit.
TEST(ApiStaged, AnEngineThatDoesNotPauseKeepsItsWeightsAndCatchesUpLater) {
  for (const bool hang : {false, true}) {
    SCOPED_TRACE(hang ? "pause hangs" : "pause fails");
    Cluster cluster;
    Model trainer(10);
    Model w1 = trainer, w2 = trainer;
    EngineLog staged;
    std::atomic<int> refusals{1};
    auto pause = [&]() -> deltacast::Status {
      if (refusals.fetch_sub(1) <= 0) return deltacast::Status::Ok();
      if (hang) {
        std::this_thread::sleep_for(milliseconds(1500));  // past the 500 ms timeout
        return deltacast::Status::Ok();
      }
      return deltacast::Status::Unavailable("engine busy");
    };
    auto source = cluster.Source();
    deltacast::Node& n1 = cluster.Start("w1", w1, &staged, pause);
    cluster.Start("w2", w2, nullptr, {}, "on-arrival");
    ASSERT_TRUE(n1.WaitForJoin(milliseconds(10000)).ok());
    Model v1 = Step(trainer, 11);
    auto report = source->Publish(trainer.Views(), v1.Views());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(w1.bytes, trainer.bytes) << "written without a pause";
    EXPECT_EQ(w2.bytes, v1.bytes);
    // The late pause was followed by a resume: the engine is not left paused.
    if (hang) {
      WaitForResumes(staged, 1);
      std::lock_guard lock(staged.mu);
      EXPECT_EQ(staged.pauses, 1);
      EXPECT_EQ(staged.resumes, 1);
    }
    // The next refit: w1 catches up to v1 behind the hooks, then takes v2.
    Model v2 = Step(v1, 12);
    report = source->Publish(v1.Views(), v2.Views());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_TRUE(report->committed) << report->abort_reason;
    EXPECT_EQ(w1.bytes, v2.bytes);
    EXPECT_EQ(w2.bytes, v2.bytes);
    // Paused and resumed for the held delta, then for v2.
    WaitForResumes(staged, hang ? 3 : 2);
    std::lock_guard lock(staged.mu);
    EXPECT_EQ(staged.pauses, hang ? 3 : 2);
    EXPECT_FALSE(staged.paused);
    source->Stop();
  }
}

TEST(ApiStaged, AnUnknownApplyModeIsRefused) {
  Cluster cluster;
  Model w1(3);
  deltacast::NodeOptions options;
  options.node_id = "w1";
  options.token = "t";
  options.apply_mode = "lazy";
  auto node = deltacast::Node::Start(cluster.config, options, w1.Views());
  ASSERT_FALSE(node.ok());
  EXPECT_THAT(node.status().message(), HasSubstr("apply_mode"));
}

}  // namespace
