#include "deltacast/config.h"

#include "api/internal.h"
#include "common/log.h"
#include "deltacast/log.h"
#include "topology/plan_format.h"
#include "topology/tree_plan.h"

namespace deltacast {

Result<Config> Config::Load(const std::filesystem::path& path) {
  auto cluster = topology::LoadClusterConfig(path);
  if (!cluster.ok()) return cluster.status();
  return Config(std::make_shared<const Impl>(Impl{std::move(*cluster)}));
}

Result<Config> Config::Parse(std::string_view toml, std::string_view name) {
  auto cluster = topology::ParseClusterConfig(toml, name);
  if (!cluster.ok()) return cluster.status();
  return Config(std::make_shared<const Impl>(Impl{std::move(*cluster)}));
}

std::string Config::source() const { return impl_->cluster.Source()->id; }

std::vector<std::string> Config::receivers() const {
  std::vector<std::string> out;
  for (const auto& node : impl_->cluster.nodes) {
    if (node.role == topology::Role::kReceiver) out.push_back(node.id);  // not senders
  }
  return out;
}

Result<std::string> Config::TokenFromEnvironment() const {
  return topology::ReadAuthToken(impl_->cluster);
}

Result<std::string> Config::DescribePlan() const {
  auto plan = topology::PlanTree(impl_->cluster);
  if (!plan.ok()) return plan.status();
  return topology::FormatPlanText(*plan, impl_->cluster, uint64_t{1} << 30);
}

static_assert(static_cast<int>(LogLevel::kOff) == static_cast<int>(log::Level::kOff) &&
                  static_cast<int>(LogLevel::kDebug) == static_cast<int>(log::Level::kDebug),
              "the public log levels mirror the internal ones");

void SetLogLevel(LogLevel level) {
  log::SetLevel(static_cast<log::Level>(static_cast<int>(level)));
}

namespace api {

Result<std::unique_ptr<apply::WeightStore>> BorrowTensors(const std::vector<TensorView>& tensors) {
  std::vector<std::pair<TensorSpec, MutableByteSpan>> spans;
  spans.reserve(tensors.size());
  for (const TensorView& t : tensors) {
    spans.emplace_back(TensorSpec{t.spec.name, t.spec.dtype, t.spec.shape},
                       MutableByteSpan(t.bytes.data(), t.bytes.size()));
  }
  auto store = apply::HostStore::Borrow(std::move(spans));
  if (!store.ok()) return store.status();
  return std::unique_ptr<apply::WeightStore>(std::move(*store));
}

}  // namespace api
}  // namespace deltacast
