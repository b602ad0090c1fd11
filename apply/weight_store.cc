#include "apply/weight_store.h"

#include <algorithm>

namespace deltacast::apply {

std::optional<size_t> WeightStore::FindTensor(std::string_view name) const {
  const auto& all = tensors();
  auto it =
      std::lower_bound(all.begin(), all.end(), name,
                       [](const codec::TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == all.end() || it->name != name) return std::nullopt;
  return static_cast<size_t>(it - all.begin());
}

}  // namespace deltacast::apply
