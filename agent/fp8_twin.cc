#include "agent/fp8_twin.h"

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "apply/checkpoint_dir.h"
#include "apply/safetensors.h"
#include "common/bytes.h"
#include "common/file_util.h"
#include "common/parallel.h"
#include "quant/fp8_quantizer.h"

namespace deltacast::agent {
namespace {

namespace fs = std::filesystem;

TensorSpec Spec(const TensorSpec& t) { return {t.name, t.dtype, t.shape}; }
TensorSpec Info(const TensorSpec& t) { return {t.name, t.dtype, t.shape}; }

// The served tensors of a plan, in order: each weight, then its scale if quantized.
std::vector<TensorSpec> ServedInfos(const std::vector<quant::ServedTensor>& plan) {
  std::vector<TensorSpec> out;
  for (const quant::ServedTensor& s : plan) {
    out.push_back(Info(s.weight));
    if (s.quantized()) out.push_back(Info(s.scale));
  }
  return out;
}

// Quantizes (or copies) one served tensor's bytes into `weight` and `scale`.
Status Serve(const quant::ServedTensor& s, ByteSpan source, MutableByteSpan weight,
             MutableByteSpan scale) {
  if (source.size() != s.canonical.ByteSize()) {
    return Status::InvalidArgument("tensor '" + s.canonical.name +
                                   "' does not have the size its plan says");
  }
  if (!s.quantized()) {
    std::memcpy(weight.data(), source.data(), source.size());
    return Status::Ok();
  }
  const uint64_t rows = s.canonical.shape[0], cols = s.canonical.shape[1];
  return quant::QuantizeFp8(*s.scheme, s.canonical.name,
                            {reinterpret_cast<const uint16_t*>(source.data()), rows * cols}, rows,
                            cols, {reinterpret_cast<uint8_t*>(weight.data()), rows * cols},
                            {reinterpret_cast<float*>(scale.data()), scale.size() / sizeof(float)});
}

// Runs fn(i) for i in [0, n) on `threads` threads; the first error wins.
Status ParallelStatus(size_t n, size_t threads, const std::function<Status(size_t)>& fn) {
  std::vector<Status> statuses(n);
  ParallelFor(n, threads == 0 ? DefaultThreadCount() : threads,
              [&](size_t i) { statuses[i] = fn(i); });
  for (Status& s : statuses) RETURN_IF_ERROR(s);
  return Status::Ok();
}

// The directory's quantization_config; nullopt when it has none to check.
Result<std::optional<quant::QuantizationConfig>> ReadQuantizationConfig(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<quant::QuantizationConfig>();
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadFile(path, 1 << 24));
  const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  // An unreadable config.json is the engine's business; only a quantization_config
  // that is there is held to the checkpoint.
  if (!nlohmann::json::accept(text)) return std::optional<quant::QuantizationConfig>();
  auto config = quant::ParseQuantizationConfig(text, path.string());
  if (config.status().code() == StatusCode::kNotFound) {
    return std::optional<quant::QuantizationConfig>();
  }
  if (!config.ok()) return config.status();
  return std::optional<quant::QuantizationConfig>(std::move(*config));
}

bool Checked(const quant::QuantizationConfig& c) {
  return c.quant_method == "fp8" && !c.weight_block_size.empty();
}

std::string Describe(const std::optional<quant::QuantizationConfig>& c) {
  if (!c) return "no quantization_config";
  std::string block = "[";
  for (size_t i = 0; i < c->weight_block_size.size(); ++i) {
    block += (i ? ", " : "") + std::to_string(c->weight_block_size[i]);
  }
  return "quant_method '" + c->quant_method + "', fmt '" + c->fmt + "', weight_block_size " +
         block + "], scale_fmt '" + c->scale_fmt + "'";
}

}  // namespace

quant::ServingDescription DefaultFp8Serving(std::string_view scheme) {
  quant::ServingDescription d;
  d.source = "synth's default serving description";
  d.scheme = quant::FindFp8Scheme(scheme);
  d.quantize = {"model.layers.*.weight"};
  d.not_converted = {"*norm.weight", "*.mlp.gate.weight"};
  return d;
}

Result<std::vector<quant::ServedTensor>> PlanFp8Twin(const quant::ServingDescription& serving,
                                                     const std::vector<TensorSpec>& tensors) {
  std::vector<TensorSpec> specs;
  for (const TensorSpec& t : tensors) specs.push_back(Spec(t));
  return quant::PlanServing(serving, specs);
}

Result<std::unique_ptr<apply::HostStore>> QuantizeStore(
    const apply::WeightStore& bf16, const std::vector<quant::ServedTensor>& plan, size_t threads) {
  std::map<std::string, size_t> source_index, served_index;
  for (size_t i = 0; i < bf16.tensors().size(); ++i) source_index[bf16.tensors()[i].name] = i;
  ASSIGN_OR_RETURN(auto store, apply::HostStore::Create(ServedInfos(plan)));
  for (size_t i = 0; i < store->tensors().size(); ++i) served_index[store->tensors()[i].name] = i;
  RETURN_IF_ERROR(ParallelStatus(plan.size(), threads, [&](size_t k) -> Status {
    const quant::ServedTensor& s = plan[k];
    const auto src = source_index.find(s.canonical.name);
    if (src == source_index.end() || bf16.tensors()[src->second] != Info(s.canonical)) {
      return Status::InvalidArgument("the store's tensor '" + s.canonical.name +
                                     "' is missing or differs from the plan");
    }
    ASSIGN_OR_RETURN(MutableByteSpan weight, store->MutableTensorData(served_index[s.weight.name]));
    MutableByteSpan scale;
    if (s.quantized()) {
      ASSIGN_OR_RETURN(scale, store->MutableTensorData(served_index[s.scale.name]));
    }
    return Serve(s, bf16.TensorData(src->second), weight, scale);
  }));
  return store;
}

Status WriteFp8Twin(const fs::path& bf16_dir, const fs::path& out_dir,
                    const quant::ServingDescription& serving, size_t threads) {
  using Access = apply::CheckpointDirStore::Access;
  ASSIGN_OR_RETURN(auto source, apply::CheckpointDirStore::Open(bf16_dir, Access::kReadOnly));
  const apply::CheckpointLayout& layout = source->layout();
  ASSIGN_OR_RETURN(std::vector<quant::ServedTensor> plan, PlanFp8Twin(serving, source->tensors()));
  std::map<std::string, const quant::ServedTensor*> by_name;
  for (const quant::ServedTensor& s : plan) by_name[s.canonical.name] = &s;

  // config.json: the source's, with quantization_config.
  nlohmann::json config = nlohmann::json::object();
  if (fs::exists(bf16_dir / "config.json")) {
    ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadFile(bf16_dir / "config.json", 1 << 24));
    config = nlohmann::json::parse(
        std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), nullptr, false);
    if (!config.is_object()) {
      return Status::InvalidArgument((bf16_dir / "config.json").string() + " is not a JSON object");
    }
  }
  config["quantization_config"] = nlohmann::json::parse(quant::QuantizationConfigJson(plan));

  // The source's tensors per file, in file order (by offset).
  std::vector<std::vector<const apply::CheckpointTensor*>> per_file(layout.files.size());
  for (const apply::CheckpointTensor& t : layout.tensors) per_file[t.file].push_back(&t);
  for (auto& tensors : per_file) {
    std::sort(tensors.begin(), tensors.end(),
              [](const auto* a, const auto* b) { return a->file_offset < b->file_offset; });
  }
  std::map<std::string, size_t> source_index;
  for (size_t i = 0; i < source->tensors().size(); ++i) source_index[source->tensors()[i].name] = i;

  // Written under a temporary name and renamed when whole: a failure (a non-finite
  // element in a later file) leaves no half twin behind.
  const fs::path final_dir = out_dir;
  const fs::path work_dir = out_dir.string() + ".partial";
  std::error_code rm_ec;
  fs::remove_all(work_dir, rm_ec);
  RETURN_IF_ERROR(CreateDirectoriesDurably(work_dir));
  struct RemoveOnError {
    const fs::path& dir;
    bool done = false;
    ~RemoveOnError() {
      std::error_code ec;
      if (!done) fs::remove_all(dir, ec);
    }
  } cleanup{work_dir};
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_size = 0;
  for (size_t f = 0; f < layout.files.size(); ++f) {
    std::vector<const quant::ServedTensor*> served;
    std::vector<TensorSpec> infos;
    for (const apply::CheckpointTensor* t : per_file[f]) {
      const quant::ServedTensor* s = by_name.at(t->info.name);
      served.push_back(s);
      infos.push_back(Info(s->weight));
      if (s->quantized()) infos.push_back(Info(s->scale));
    }
    // Quantize the file's tensors into memory, then write them in order.
    std::vector<std::vector<std::byte>> weights(served.size()), scales(served.size());
    RETURN_IF_ERROR(ParallelStatus(served.size(), threads, [&](size_t k) -> Status {
      const quant::ServedTensor& s = *served[k];
      weights[k].resize(s.weight.ByteSize());
      if (s.quantized()) scales[k].resize(s.scale.ByteSize());
      return Serve(s, source->TensorData(source_index.at(s.canonical.name)), weights[k], scales[k]);
    }));
    ASSIGN_OR_RETURN(auto writer,
                     apply::SafetensorsWriter::Create(work_dir / layout.files[f].name, infos));
    for (size_t k = 0; k < served.size(); ++k) {
      RETURN_IF_ERROR(writer->Append(weights[k]));
      weight_map[served[k]->weight.name] = layout.files[f].name;
      total_size += weights[k].size();
      if (served[k]->quantized()) {
        RETURN_IF_ERROR(writer->Append(scales[k]));
        weight_map[served[k]->scale.name] = layout.files[f].name;
        total_size += scales[k].size();
      }
    }
    RETURN_IF_ERROR(writer->Finish());
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total_size}}},
                                {"weight_map", std::move(weight_map)}};
  RETURN_IF_ERROR(
      WriteFile(work_dir / apply::kCheckpointIndexFileName, AsBytes(index.dump(2) + "\n")));
  RETURN_IF_ERROR(WriteFile(work_dir / "config.json", AsBytes(config.dump(2) + "\n")));
  std::error_code ec;
  fs::remove_all(final_dir, ec);
  fs::rename(work_dir, final_dir, ec);
  if (ec) return Status::IoError("cannot rename " + work_dir.string() + ": " + ec.message());
  cleanup.done = true;
  return FsyncDirectory(final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path());
}

Status CheckFp8CheckpointDir(const fs::path& dir) {
  ASSIGN_OR_RETURN(std::optional<quant::QuantizationConfig> config, ReadQuantizationConfig(dir));
  if (!config || !Checked(*config)) return Status::Ok();
  using Access = apply::CheckpointDirStore::Access;
  ASSIGN_OR_RETURN(auto store, apply::CheckpointDirStore::Open(dir, Access::kReadOnly));
  std::vector<TensorSpec> specs;
  for (const TensorSpec& t : store->tensors()) specs.push_back(Spec(t));
  return quant::CheckFp8Checkpoint(specs, *config)
      .WithContext(dir.string() + " (FP8 checkpoint, config.json's quantization_config)");
}

Status CheckFp8Versions(const fs::path& base, const fs::path& target) {
  RETURN_IF_ERROR(CheckFp8CheckpointDir(base));
  RETURN_IF_ERROR(CheckFp8CheckpointDir(target));
  ASSIGN_OR_RETURN(auto base_config, ReadQuantizationConfig(base));
  ASSIGN_OR_RETURN(auto target_config, ReadQuantizationConfig(target));
  const bool base_fp8 = base_config && Checked(*base_config);
  const bool target_fp8 = target_config && Checked(*target_config);
  if (!base_fp8 && !target_fp8) return Status::Ok();
  if (base_fp8 != target_fp8 || base_config->quant_method != target_config->quant_method ||
      base_config->fmt != target_config->fmt ||
      base_config->weight_block_size != target_config->weight_block_size ||
      base_config->scale_fmt != target_config->scale_fmt) {
    return Status::InvalidArgument("the receivers' checkpoint " + base.string() + " has " +
                                   Describe(base_config) + "; " + target.string() + " has " +
                                   Describe(target_config));
  }
  return Status::Ok();
}

}  // namespace deltacast::agent
