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

Status WeightStore::FlushAll() {
  for (size_t i = 0; i < tensors().size(); ++i)
    RETURN_IF_ERROR(Flush(i, 0, tensors()[i].ByteSize()));
  return Status::Ok();
}

}  // namespace deltacast::apply
