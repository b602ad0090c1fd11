// `deltacast layout engine`: plans written for every GPU and read back against the
// checkpoint's tensor table; a config that does not describe the checkpoint (its
// plans would leave tensors nobody holds) fails, and so does a split the engine
// would refuse.
#include "agent/layout_commands.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "agent/commands.h"
#include "layout/description.h"
#include "tests/layout/engine_reference.h"

namespace deltacast::agent {
namespace {

namespace fs = std::filesystem;
using layout::testing::EngineModel;

class LayoutEngineCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("layout_engine_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // config.json of `config` and canonical.json of `checkpoint`'s tensors.
  void Write(const EngineModel& config, const EngineModel& checkpoint) {
    std::ofstream(dir_ / "config.json") << config.ConfigJson();
    std::ofstream table(dir_ / "canonical.json");
    table << "{\"tensors\": [";
    const auto tensors = layout::testing::EngineCanonical(checkpoint);
    for (size_t i = 0; i < tensors.size(); ++i) {
      table << (i ? ", " : "") << "{\"name\": \"" << tensors[i].spec.name
            << "\", \"dtype\": \"BF16\", \"shape\": [";
      for (size_t d = 0; d < tensors[i].spec.shape.size(); ++d)
        table << (d ? ", " : "") << tensors[i].spec.shape[d];
      table << "]}";
    }
    table << "]}\n";
  }

  LayoutEngineArgs Args(uint64_t tp) const {
    LayoutEngineArgs a;
    a.config = dir_ / "config.json";
    a.canonical = dir_ / "canonical.json";
    a.out = dir_ / "plans";
    a.tp = tp;
    return a;
  }

  fs::path dir_;
};

TEST_F(LayoutEngineCommand, WritesOnePlanPerGpuThatHoldsTheCheckpoint) {
  EngineModel m;
  Write(m, m);
  ASSERT_EQ(RunLayoutEngine(Args(4)), kExitOk);
  for (int g = 0; g < 4; ++g) {
    auto d = layout::LoadLayout(dir_ / "plans" / ("gpu-" + std::to_string(g) + ".toml"));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->rank.tp, static_cast<uint64_t>(g));
    EXPECT_EQ(d->canonical, fs::path("../canonical.json"));
  }
  EXPECT_FALSE(fs::exists(dir_ / "plans" / "gpu-4.toml"));
}

TEST_F(LayoutEngineCommand, AConfigThatDoesNotDescribeTheCheckpointFails) {
  EngineModel tied;
  tied.tied = true;  // no lm_head rule, but the checkpoint has lm_head.weight
  Write(tied, EngineModel{});
  EXPECT_EQ(RunLayoutEngine(Args(2)), kExitFailure);
  EngineModel m;
  Write(m, m);
  EXPECT_EQ(RunLayoutEngine(Args(3)), kExitFailure);  // 8 heads over 3 GPUs
}

}  // namespace
}  // namespace deltacast::agent
