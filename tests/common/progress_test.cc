#include "common/progress.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace deltacast::progress {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

Options Bytes(uint64_t total) {
  Options o;
  o.label = "encode";
  o.total = total;
  o.width = 100;
  return o;
}

std::string Line(const Options& o, uint64_t done, double seconds) {
  return Progress::Render(o, done, o.total, seconds);
}

TEST(ProgressRender, BytesWithABarPercentRateAndEta) {
  const std::string line = Line(Bytes(uint64_t{1000} << 20), uint64_t{500} << 20, 2.0);
  EXPECT_THAT(line, StartsWith("encode   ["));
  EXPECT_THAT(line, HasSubstr(" 50%"));
  EXPECT_THAT(line, HasSubstr("500.0/1000.0 MiB"));
  EXPECT_THAT(line, HasSubstr("250.0 MiB/s"));
  EXPECT_THAT(line, HasSubstr("ETA 2.0s"));
  // Half the bar filled.
  const size_t open = line.find('['), close = line.find(']');
  const std::string bar = line.substr(open + 1, close - open - 1);
  EXPECT_EQ(std::count(bar.begin(), bar.end(), '#'), static_cast<long>(bar.size() / 2)) << bar;
}

TEST(ProgressRender, DoneShowsTheTimeTakenAndNeverOverflows) {
  const std::string line = Line(Bytes(1 << 20), 2 << 20, 65.0);
  EXPECT_THAT(line, HasSubstr("100%"));
  EXPECT_THAT(line, HasSubstr("1.0/1.0 MiB"));
  EXPECT_THAT(line, HasSubstr("in 1m05s"));
  EXPECT_THAT(line, Not(HasSubstr("ETA")));
}

TEST(ProgressRender, UnknownTotalAndItems) {
  Options unknown = Bytes(0);
  const std::string line = Line(unknown, 3 << 20, 1.0);
  EXPECT_THAT(line, Not(HasSubstr("%")));
  EXPECT_THAT(line, Not(HasSubstr("[")));
  EXPECT_THAT(line, HasSubstr("3.0 MiB"));

  Options items;
  items.label = "synth";
  items.total = 4;
  items.unit = Unit::kItems;
  items.item_name = "steps";
  const std::string steps = Line(items, 1, 10.0);
  EXPECT_THAT(steps, HasSubstr(" 25%"));
  EXPECT_THAT(steps, HasSubstr("1/4 steps"));
  EXPECT_THAT(steps, HasSubstr("ETA 30s"));
}

TEST(ProgressRender, FitsTheWidth) {
  for (int width : {20, 40, 60, 80, 200}) {
    Options o = Bytes(uint64_t{5} << 30);
    o.label = "a rather long label for the work";
    o.width = width;
    const std::string line = Line(o, uint64_t{1} << 30, 3.0);
    EXPECT_LE(line.size(), size_t(width - 1)) << line;
  }
  // The bar gives way to the figures: nothing is cut at 80 columns.
  Options eighty = Bytes(uint64_t{568} << 20);
  eighty.label = "synth";
  eighty.width = 80;
  EXPECT_THAT(Line(eighty, uint64_t{568} << 20, 65.0), EndsWith("in 1m05s"));
  EXPECT_THAT(Line(eighty, uint64_t{284} << 20, 65.0), EndsWith("ETA 1m05s"));
  // A narrow terminal drops the bar, keeps the percentage.
  Options narrow = Bytes(100);
  narrow.width = 40;
  const std::string line = Line(narrow, 50, 1.0);
  EXPECT_THAT(line, Not(HasSubstr("[")));
  EXPECT_THAT(line, HasSubstr("50%"));
}

// A clock the test moves by hand.
struct FakeClock {
  Clock::time_point now{};
  Progress::Clock Fn() {
    return [this] { return now; };
  }
};

TEST(Progress, RedrawsAtMostOncePerInterval) {
  FakeClock clock;
  std::vector<std::string> drawn;
  Options o = Bytes(1000);
  o.min_interval = std::chrono::milliseconds(100);
  Progress p(
      o, [&](std::string_view s) { drawn.emplace_back(s); }, clock.Fn());
  EXPECT_TRUE(p.enabled());
  for (int i = 0; i < 100; ++i) p.Add(1);  // no time passes: one draw
  ASSERT_EQ(drawn.size(), 1u);
  EXPECT_THAT(drawn[0], StartsWith("\r"));
  EXPECT_THAT(drawn[0], EndsWith("\x1b[K"));
  clock.now += std::chrono::milliseconds(99);
  p.Add(1);
  EXPECT_EQ(drawn.size(), 1u);
  clock.now += std::chrono::milliseconds(1);
  p.Add(1);
  ASSERT_EQ(drawn.size(), 2u);
  EXPECT_THAT(drawn[1], HasSubstr("102/1000 B"));
  clock.now += std::chrono::seconds(1);
  p.Set(1000);
  ASSERT_EQ(drawn.size(), 3u);
  clock.now += std::chrono::seconds(5);  // the caller's own work after the last update
  p.Finish();
  ASSERT_EQ(drawn.size(), 4u);
  EXPECT_THAT(drawn[3], EndsWith("\n"));
  EXPECT_THAT(drawn[3], HasSubstr("100%"));
  EXPECT_THAT(drawn[3], HasSubstr("in 1.1s"));  // the work's time, to its last update
  // Finished: nothing more, not even from the destructor.
  clock.now += std::chrono::seconds(1);
  p.Add(5);
  p.Finish();
  EXPECT_EQ(drawn.size(), 4u);
}

TEST(Progress, WithoutASinkDrawsNothing) {
  Progress p(Bytes(10), Progress::Sink{});
  EXPECT_FALSE(p.enabled());
  p.Add(5);
  p.Finish();  // nothing to check but that nothing crashes; enabled() is the contract
  EXPECT_FALSE(p.enabled());
}

// With stderr not a terminal (a file here), or with enabled = false (--json),
// ForTerminal's bar writes nothing at all.
TEST(Progress, ForTerminalIsOffWhenStderrIsNotATerminalOrWhenAsked) {
  char path[] = "/tmp/progress_test_XXXXXX";
  const int file = ::mkstemp(path);
  ASSERT_GE(file, 0);
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  ASSERT_GE(::dup2(file, STDERR_FILENO), 0);
  {
    auto p = Progress::ForTerminal(Bytes(100));
    EXPECT_FALSE(p->enabled());
    p->Add(50);
    p->Finish();
    auto q = Progress::ForTerminal(Bytes(100), /*enabled=*/false);
    EXPECT_FALSE(q->enabled());
    q->Add(50);
  }
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  EXPECT_EQ(::lseek(file, 0, SEEK_END), 0) << "a bar wrote to a stderr that is not a terminal";
  ::close(file);
  ::unlink(path);
  auto off = Progress::ForTerminal(Bytes(100), /*enabled=*/false);
  EXPECT_FALSE(off->enabled());
}

TEST(Progress, ConcurrentUpdatesCountEveryOneAndNeverDrawTwiceAtOnce) {
  std::atomic<int> drawing{0};
  std::atomic<bool> overlapped{false};
  std::string last;
  std::mutex last_mu;
  Options o = Bytes(8 * 20000);
  o.min_interval = std::chrono::milliseconds(0);
  {
    Progress p(o, [&](std::string_view s) {
      if (drawing.fetch_add(1) != 0) overlapped = true;
      {
        std::lock_guard lock(last_mu);
        last = s;
      }
      drawing.fetch_sub(1);
    });
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 20000; ++i) p.Add(1);
      });
    }
    for (auto& t : threads) t.join();
  }  // the destructor finishes
  EXPECT_FALSE(overlapped);
  EXPECT_THAT(last, HasSubstr("100%"));
  EXPECT_THAT(last, HasSubstr("156.2/156.2 KiB"));
  EXPECT_THAT(last, EndsWith("\n"));
}

TEST(Progress, TerminalLineRunsTheWrite) {
  int calls = 0;
  WithTerminalLine([&] { ++calls; });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace deltacast::progress
