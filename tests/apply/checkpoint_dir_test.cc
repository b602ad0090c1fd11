#include "apply/checkpoint_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "apply/safetensors.h"
#include "common/file_util.h"
#include "tests/apply/test_util.h"

namespace deltacast::apply {
namespace {

namespace fs = std::filesystem;
using ::deltacast::apply::testing::Pattern;
using ::deltacast::apply::testing::ReadAll;
using ::deltacast::apply::testing::ScratchDir;
using ::deltacast::apply::testing::WriteRawSafetensors;
using ::testing::HasSubstr;
using Access = CheckpointDirStore::Access;
using ReadPath = CheckpointDirStore::ReadPath;

class CheckpointDirTest : public ::testing::Test {
 protected:
  // Writes `name` holding `tensors` in that order; each tensor's bytes are
  // Pattern(size, seed of its name) and are remembered in contents_.
  void WriteFile(const std::string& name, const std::vector<TensorSpec>& tensors,
                 const fs::path& in = {}) {
    const fs::path dir = in.empty() ? dir_.path() : in;
    auto writer = SafetensorsWriter::Create(dir / name, tensors, {{"format", "pt"}});
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    for (const auto& t : tensors) {
      contents_[t.name] =
          Pattern(t.ByteSize(), static_cast<uint32_t>(std::hash<std::string>{}(t.name)));
      ASSERT_TRUE((*writer)->Append(contents_[t.name]).ok());
    }
    ASSERT_TRUE((*writer)->Finish().ok());
  }

  void WriteIndex(const std::string& json) {
    ASSERT_TRUE(deltacast::WriteFile(dir_.path() / kCheckpointIndexFileName, AsBytes(json)).ok());
  }

  // Two shards and an index, as Hugging Face saves a sharded model.
  void WriteShardedCheckpoint() {
    WriteFile("model-00001-of-00002.safetensors",
              {{"model.embed_tokens.weight", DType::kBF16, {16, 8}},
               {"model.layers.0.mlp.weight", DType::kBF16, {8, 8}},
               {"model.layers.0.empty", DType::kF32, {0, 3}}});
    WriteFile("model-00002-of-00002.safetensors",
              {{"model.norm.weight", DType::kF32, {8}}, {"lm_head.weight", DType::kF16, {16, 8}}});
    WriteIndex(R"({"metadata": {"total_size": 1056}, "weight_map": {
        "lm_head.weight": "model-00002-of-00002.safetensors",
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.layers.0.empty": "model-00001-of-00002.safetensors",
        "model.layers.0.mlp.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00002-of-00002.safetensors"}})");
  }

  template <typename T>
  static void ExpectError(const Result<T>& result, StatusCode code, const std::string& substring) {
    ASSERT_FALSE(result.ok()) << "expected an error containing \"" << substring << "\"";
    EXPECT_EQ(result.status().code(), code) << result.status().ToString();
    EXPECT_THAT(result.status().message(), HasSubstr(substring));
  }

  // Every tensor of `store` holds the bytes this test wrote for it.
  void ExpectContents(const WeightStore& store) {
    ASSERT_EQ(store.tensors().size(), contents_.size());
    for (size_t i = 0; i < store.tensors().size(); ++i) {
      const auto& name = store.tensors()[i].name;
      ASSERT_EQ(contents_.count(name), 1u) << name;
      const ByteSpan data = store.TensorData(i);
      ASSERT_EQ(data.size(), contents_[name].size()) << name;
      EXPECT_TRUE(std::equal(data.begin(), data.end(), contents_[name].begin())) << name;
    }
  }

  ScratchDir dir_;
  std::map<std::string, std::vector<std::byte>> contents_;
};

TEST_F(CheckpointDirTest, SingleFileWithoutIndex) {
  WriteFile("model.safetensors", {{"b", DType::kBF16, {3, 4}}, {"a", DType::kF32, {5}}});
  auto layout = ReadCheckpointLayout(dir_.path());
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(layout->files.size(), 1u);
  const CheckpointFile& file = layout->files[0];
  EXPECT_EQ(file.name, "model.safetensors");
  const std::string bytes = ReadAll(dir_.path() / "model.safetensors");
  EXPECT_EQ(file.size, bytes.size());
  EXPECT_EQ(file.data_offset, 8 + LoadLE<uint64_t>(AsBytes(bytes).data()));
  EXPECT_EQ(file.header_hash, Hash64(AsBytes(bytes).first(file.data_offset)));
  EXPECT_EQ(layout->index_hash, 0u);
  // Sorted by name, pointing at the bytes where the writer put them (b first).
  ASSERT_EQ(layout->tensors.size(), 2u);
  EXPECT_EQ(layout->tensors[0].info.name, "a");
  EXPECT_EQ(layout->tensors[0].file_offset, file.data_offset + 24);
  EXPECT_EQ(layout->tensors[1].info.name, "b");
  EXPECT_EQ(layout->tensors[1].file_offset, file.data_offset);

  auto store = CheckpointDirStore::Open(dir_.path(), Access::kReadOnly);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ExpectContents(**store);
  EXPECT_EQ((*store)->LayoutId(), layout->LayoutId());
  EXPECT_FALSE((*store)->LayoutId().IsZero());
  EXPECT_EQ((*store)->FindTensor("b"), 1u);
}

TEST_F(CheckpointDirTest, ShardedCheckpointWithIndex) {
  WriteShardedCheckpoint();
  auto store = CheckpointDirStore::Open(dir_.path(), Access::kReadOnly);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const CheckpointLayout& layout = (*store)->layout();
  ASSERT_EQ(layout.files.size(), 2u);
  EXPECT_EQ(layout.files[0].name, "model-00001-of-00002.safetensors");
  EXPECT_EQ(layout.files[1].name, "model-00002-of-00002.safetensors");
  EXPECT_EQ(layout.index_hash, Hash64(AsBytes(ReadAll(dir_.path() / kCheckpointIndexFileName))));
  std::vector<std::string> names;
  for (const auto& t : (*store)->tensors()) names.push_back(t.name);
  EXPECT_THAT(names, ::testing::ElementsAre("lm_head.weight", "model.embed_tokens.weight",
                                            "model.layers.0.empty", "model.layers.0.mlp.weight",
                                            "model.norm.weight"));
  EXPECT_EQ(layout.tensors[0].file, 1u);
  EXPECT_EQ(layout.tensors[1].file, 0u);
  ExpectContents(**store);
}

TEST_F(CheckpointDirTest, LayoutIdCoversIndexHeadersAndNames) {
  WriteShardedCheckpoint();
  auto first = ReadCheckpointLayout(dir_.path());
  ASSERT_TRUE(first.ok());
  auto again = ReadCheckpointLayout(dir_.path());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(first->LayoutId(), again->LayoutId());

  // Only the index's bytes change (whitespace): the layout id must change.
  std::string index = ReadAll(dir_.path() / kCheckpointIndexFileName);
  WriteIndex(index + "\n");
  auto reindexed = ReadCheckpointLayout(dir_.path());
  ASSERT_TRUE(reindexed.ok());
  EXPECT_NE(reindexed->LayoutId(), first->LayoutId());

  // Same tensor names, shapes and bytes; only the header metadata differs.
  ScratchDir np_dir;
  auto writer = SafetensorsWriter::Create(np_dir.path() / "model.safetensors",
                                          {{"a", DType::kU8, {1}}}, {{"format", "np"}});
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(Pattern(1, 1)).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  ScratchDir pt_dir;
  WriteFile("model.safetensors", {{"a", DType::kU8, {1}}}, pt_dir.path());
  auto np = ReadCheckpointLayout(np_dir.path());
  auto pt = ReadCheckpointLayout(pt_dir.path());
  ASSERT_TRUE(np.ok() && pt.ok());
  EXPECT_EQ(np->files[0].size, pt->files[0].size);
  EXPECT_NE(np->LayoutId(), pt->LayoutId());

  // Same file contents under another file name.
  fs::rename(pt_dir.path() / "model.safetensors", pt_dir.path() / "renamed.safetensors");
  auto renamed = ReadCheckpointLayout(pt_dir.path());
  ASSERT_TRUE(renamed.ok());
  EXPECT_NE(renamed->LayoutId(), pt->LayoutId());
}

TEST_F(CheckpointDirTest, WithoutIndexIgnoresOtherFilesAndSubdirectories) {
  WriteFile("a.safetensors", {{"x", DType::kU8, {4}}});
  WriteFile("b.safetensors", {{"y", DType::kU8, {4}}});
  ASSERT_TRUE(deltacast::WriteFile(dir_.path() / "config.json", AsBytes("{}")).ok());
  ASSERT_TRUE(deltacast::WriteFile(dir_.path() / "a.safetensors.tmp", AsBytes("junk")).ok());
  fs::create_directory(dir_.path() / ".deltacast");
  ASSERT_TRUE(
      deltacast::WriteFile(dir_.path() / ".deltacast" / "c.safetensors", AsBytes("junk")).ok());
  fs::create_directory(dir_.path() / "d.safetensors");  // a directory, not a file
  auto store = CheckpointDirStore::Open(dir_.path(), Access::kReadOnly);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_EQ((*store)->layout().files.size(), 2u);
  ExpectContents(**store);
}

TEST_F(CheckpointDirTest, IndexIgnoresUnlistedFiles) {
  WriteShardedCheckpoint();
  ASSERT_TRUE(deltacast::WriteFile(dir_.path() / "stale.safetensors", AsBytes("junk")).ok());
  auto layout = ReadCheckpointLayout(dir_.path());
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->files.size(), 2u);
}

TEST_F(CheckpointDirTest, ZeroSizeTensorsAndFileWithoutData) {
  WriteFile("empty.safetensors", {});
  WriteFile("zeros.safetensors", {{"z1", DType::kF32, {0}}, {"z2", DType::kBF16, {4, 0, 2}}});
  for (Access access : {Access::kReadOnly, Access::kReadWrite}) {
    auto store = CheckpointDirStore::Open(dir_.path(), access);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_EQ((*store)->tensors().size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE((*store)->TensorData(i).empty());
      EXPECT_TRUE((*store)->Flush(i, 0, 0).ok());
    }
    if (access == Access::kReadWrite) {
      auto data = (*store)->MutableTensorData(1);
      ASSERT_TRUE(data.ok());
      EXPECT_TRUE(data->empty());
    }
  }
}

TEST_F(CheckpointDirTest, WritesLandInFileAfterFlush) {
  WriteShardedCheckpoint();
  const std::string name = "model.embed_tokens.weight";
  std::vector<std::byte> patch = Pattern(100, 77);
  uint64_t file_offset = 0;
  std::string file_name;
  {
    auto store = CheckpointDirStore::Open(dir_.path(), Access::kReadWrite);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    const size_t index = *(*store)->FindTensor(name);
    auto data = (*store)->MutableTensorData(index);
    ASSERT_TRUE(data.ok()) << data.status().ToString();
    ASSERT_EQ(data->size(), 256u);
    // An unaligned range in the middle: Flush must page-align it itself.
    std::memcpy(data->data() + 13, patch.data(), patch.size());
    ASSERT_TRUE((*store)->Flush(index, 13, patch.size()).ok());
    const CheckpointTensor& t = (*store)->layout().tensors[index];
    file_offset = t.file_offset;
    file_name = (*store)->layout().files[t.file].name;

    // While the store is still open, the file already has the bytes.
    const std::string bytes = ReadAll(dir_.path() / file_name);
    EXPECT_EQ(bytes.substr(file_offset + 13, patch.size()), std::string(AsChars(patch)));
  }
  std::memcpy(contents_[name].data() + 13, patch.data(), patch.size());
  auto reopened = CheckpointDirStore::Open(dir_.path(), Access::kReadOnly);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  ExpectContents(**reopened);
}

TEST_F(CheckpointDirTest, FlushChecksRange) {
  WriteFile("model.safetensors", {{"a", DType::kF32, {4}}});
  auto store = CheckpointDirStore::Open(dir_.path(), Access::kReadWrite);
  ASSERT_TRUE(store.ok());
  EXPECT_TRUE((*store)->Flush(0, 0, 16).ok());
  EXPECT_TRUE((*store)->Flush(0, 16, 0).ok());
  EXPECT_EQ((*store)->Flush(0, 8, 9).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->Flush(0, 17, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->Flush(0, 8, UINT64_MAX).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->Flush(1, 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->MutableTensorData(1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*store)->TensorData(1).empty());
}

TEST_F(CheckpointDirTest, ReadOnlyStoreRefusesWrites) {
  WriteFile("model.safetensors", {{"a", DType::kF32, {4}}});
  auto store = CheckpointDirStore::Open(dir_.path(), Access::kReadOnly);
  ASSERT_TRUE(store.ok());
  ExpectError((*store)->MutableTensorData(0), StatusCode::kUnsupported, "read-only");
  EXPECT_TRUE((*store)->Flush(0, 0, 16).ok());
}

// Either way ReadRange reads the bytes written to the files, for every range, and
// writes made through the mapping a moment before: kCopy into the caller's buffer,
// kMap as a view of the mapping, its pages populated, the buffer untouched.
TEST_F(CheckpointDirTest, ReadRangeReadsWhatTheFilesHoldByEitherPath) {
  WriteShardedCheckpoint();
  for (ReadPath path : {ReadPath::kCopy, ReadPath::kMap}) {
    auto store = CheckpointDirStore::Open(dir_.path(), Access::kReadWrite);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    (*store)->set_read_path(path);
    const bool view = path == ReadPath::kMap;
    std::vector<std::byte> scratch(4096, std::byte{0x5A});
    for (size_t i = 0; i < (*store)->tensors().size(); ++i) {
      const std::vector<std::byte>& written = contents_[(*store)->tensors()[i].name];
      const ByteSpan all = (*store)->TensorData(i);
      for (uint64_t offset : {uint64_t{0}, uint64_t{3}, uint64_t(all.size())}) {
        if (offset > all.size()) continue;
        const uint64_t length = all.size() - offset;
        auto read = (*store)->ReadRange(i, offset, length, scratch);
        ASSERT_TRUE(read.ok()) << read.status().ToString();
        ASSERT_EQ(read->size(), length);
        EXPECT_TRUE(std::equal(read->begin(), read->end(), written.begin() + offset));
        if (length > 0) {
          EXPECT_EQ(read->data(), view ? all.data() + offset : scratch.data());
        }
      }
    }
    if (view) {
      EXPECT_EQ(scratch, std::vector<std::byte>(4096, std::byte{0x5A}));
    }
    const size_t index = *(*store)->FindTensor("lm_head.weight");
    auto data = (*store)->MutableTensorData(index);
    ASSERT_TRUE(data.ok());
    (*data)[5] ^= std::byte{0xAB};
    const std::byte now = (*data)[5];
    auto read = (*store)->ReadRange(index, 4, 2, scratch);
    ASSERT_TRUE(read.ok());
    EXPECT_EQ((*read)[1], now);
    (*data)[5] ^= std::byte{0xAB};  // as written again, for the other path
  }
}

TEST_F(CheckpointDirTest, ReadRangeRefusesRangesOutsideTheTensor) {
  WriteFile("model.safetensors", {{"a", DType::kF32, {4}}});
  auto store = CheckpointDirStore::Open(dir_.path(), Access::kReadOnly);
  ASSERT_TRUE(store.ok());
  std::vector<std::byte> scratch(64, std::byte{7});
  EXPECT_TRUE((*store)->ReadRange(0, 16, 0, scratch).ok());
  ExpectError((*store)->ReadRange(0, 8, 9, scratch), StatusCode::kInvalidArgument, "'a'");
  ExpectError((*store)->ReadRange(0, 17, 0, scratch), StatusCode::kInvalidArgument, "outside");
  ExpectError((*store)->ReadRange(0, 8, UINT64_MAX, scratch), StatusCode::kInvalidArgument,
              "outside");
  ExpectError((*store)->ReadRange(1, 0, 0, scratch), StatusCode::kInvalidArgument, "out of range");
  ExpectError((*store)->ReadRange(0, 0, 16, MutableByteSpan(scratch).first(15)),
              StatusCode::kInvalidArgument, "buffer of 15 bytes");
  EXPECT_EQ(scratch, std::vector<std::byte>(64, std::byte{7}));  // nothing read
}

// A file cut short after the store opened it: the read names the file and the tensor
// instead of handing back bytes it did not read (or, mapped, raising SIGBUS).
TEST_F(CheckpointDirTest, ReadRangeOfAFileThatShrankFails) {
  for (ReadPath path : {ReadPath::kCopy, ReadPath::kMap}) {
    WriteFile("model.safetensors", {{"a", DType::kF32, {1024}}, {"b", DType::kF32, {1024}}});
    auto store = CheckpointDirStore::Open(dir_.path(), Access::kReadOnly);
    ASSERT_TRUE(store.ok());
    (*store)->set_read_path(path);
    const CheckpointTensor& b = (*store)->layout().tensors[1];
    ASSERT_EQ(b.info.name, "b");
    fs::resize_file(dir_.path() / "model.safetensors", b.file_offset + 100);
    std::vector<std::byte> scratch(4096);
    ExpectError((*store)->ReadRange(1, 0, 4096, scratch), StatusCode::kIoError, "'b'");
    auto a = (*store)->ReadRange(0, 0, 4096, scratch);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_TRUE(std::equal(a->begin(), a->end(), contents_["a"].begin()));
  }
}

// Cut one byte short, the file still has every page of the range: touching them
// raises no fault and the missing byte would read as zero. The read fails instead.
TEST_F(CheckpointDirTest, ReadRangeOfAFileCutInsideTheRangesLastPageFails) {
  for (ReadPath path : {ReadPath::kCopy, ReadPath::kMap}) {
    WriteFile("model.safetensors", {{"a", DType::kF32, {1024}}, {"b", DType::kF32, {1024}}});
    auto store = CheckpointDirStore::Open(dir_.path(), Access::kReadOnly);
    ASSERT_TRUE(store.ok());
    (*store)->set_read_path(path);
    const CheckpointTensor& b = (*store)->layout().tensors[1];
    ASSERT_EQ(b.info.name, "b");
    const uint64_t end = b.file_offset + b.info.ByteSize();
    fs::resize_file(dir_.path() / "model.safetensors", end - 1);
    std::vector<std::byte> scratch(4096);
    ExpectError((*store)->ReadRange(1, 0, 4096, scratch), StatusCode::kIoError,
                "ends at byte " + std::to_string(end - 1) + ", inside tensor 'b'");
    ExpectError((*store)->ReadRange(1, 4095, 1, scratch), StatusCode::kIoError, "shrank");
    auto head = (*store)->ReadRange(1, 0, 4095, scratch);  // what is still there reads
    ASSERT_TRUE(head.ok()) << head.status().ToString();
    EXPECT_TRUE(std::equal(head->begin(), head->end(), contents_["b"].begin()));
  }
}

// ---- Bad directories ----

TEST_F(CheckpointDirTest, MissingOrEmptyDirectory) {
  ExpectError(ReadCheckpointLayout(dir_.path() / "absent"), StatusCode::kNotFound,
              "no such checkpoint directory");
  ExpectError(ReadCheckpointLayout(dir_.path()), StatusCode::kNotFound, "no *.safetensors files");
  ASSERT_TRUE(deltacast::WriteFile(dir_.path() / "plain", AsBytes("x")).ok());
  ExpectError(ReadCheckpointLayout(dir_.path() / "plain"), StatusCode::kInvalidArgument,
              "not a directory");
}

TEST_F(CheckpointDirTest, DuplicateTensorAcrossFiles) {
  WriteFile("a.safetensors", {{"w", DType::kU8, {4}}});
  WriteFile("b.safetensors", {{"w", DType::kU8, {4}}});
  ExpectError(ReadCheckpointLayout(dir_.path()), StatusCode::kCorrupt,
              "tensor 'w' appears in both 'a.safetensors' and 'b.safetensors'");
}

TEST_F(CheckpointDirTest, CorruptFileIsNamed) {
  WriteFile("a.safetensors", {{"w", DType::kU8, {4}}});
  WriteRawSafetensors(dir_.path() / "b.safetensors",
                      R"({"v":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", Pattern(6, 1));
  auto result = CheckpointDirStore::Open(dir_.path(), Access::kReadOnly);
  ExpectError(result, StatusCode::kCorrupt, "b.safetensors: 2 trailing bytes");
}

TEST_F(CheckpointDirTest, IndexNamesMissingFile) {
  WriteShardedCheckpoint();
  fs::remove(dir_.path() / "model-00002-of-00002.safetensors");
  ExpectError(ReadCheckpointLayout(dir_.path()), StatusCode::kNotFound,
              "maps tensor 'lm_head.weight' to file 'model-00002-of-00002.safetensors', which "
              "does not exist");
}

TEST_F(CheckpointDirTest, IndexNamesMissingTensor) {
  WriteFile("model.safetensors", {{"a", DType::kU8, {4}}});
  WriteIndex(R"({"weight_map": {"a": "model.safetensors", "b": "model.safetensors"}})");
  ExpectError(ReadCheckpointLayout(dir_.path()), StatusCode::kCorrupt,
              "weight_map maps tensor 'b' to file 'model.safetensors', which has no such tensor");
}

TEST_F(CheckpointDirTest, FileHoldsUnlistedTensor) {
  WriteFile("model.safetensors", {{"a", DType::kU8, {4}}, {"extra", DType::kU8, {2}}});
  WriteIndex(R"({"weight_map": {"a": "model.safetensors"}})");
  ExpectError(ReadCheckpointLayout(dir_.path()), StatusCode::kCorrupt,
              "file 'model.safetensors' holds tensor 'extra', which weight_map does not list");
}

TEST_F(CheckpointDirTest, IndexMapsTensorToWrongFile) {
  WriteFile("a.safetensors", {{"x", DType::kU8, {4}}});
  WriteFile("b.safetensors", {{"y", DType::kU8, {4}}});
  WriteIndex(R"({"weight_map": {"x": "b.safetensors", "y": "a.safetensors"}})");
  ExpectError(ReadCheckpointLayout(dir_.path()), StatusCode::kCorrupt,
              "tensor 'x' is in file 'a.safetensors' but weight_map maps it to 'b.safetensors'");
}

TEST_F(CheckpointDirTest, IndexWithPathLikeFileName) {
  WriteFile("model.safetensors", {{"a", DType::kU8, {4}}});
  for (const char* bad :
       {"../model.safetensors", "sub/model.safetensors", "..", "", "/etc/passwd"}) {
    WriteIndex(std::string(R"({"weight_map": {"a": ")") + bad + "\"}}");
    auto result = ReadCheckpointLayout(dir_.path());
    ExpectError(result, StatusCode::kCorrupt, "weight_map: tensor 'a': file name");
  }
  WriteIndex(R"({"weight_map": {"a": "../model.safetensors"}})");
  ExpectError(ReadCheckpointLayout(dir_.path()), StatusCode::kCorrupt,
              "file name '../model.safetensors' contains a path separator");
}

TEST_F(CheckpointDirTest, MalformedIndex) {
  WriteFile("model.safetensors", {{"a", DType::kU8, {4}}});
  auto expect = [&](const std::string& json, StatusCode code, const std::string& substring) {
    WriteIndex(json);
    ExpectError(ReadCheckpointLayout(dir_.path()), code, substring);
  };
  expect(R"({"weight_map": {"a": "model.safetensors"})", StatusCode::kCorrupt, "ill-formed JSON");
  expect(R"(["model.safetensors"])", StatusCode::kCorrupt, "index is array, not a JSON object");
  expect(R"({"metadata": {}})", StatusCode::kCorrupt, "missing \"weight_map\"");
  expect(R"({"weight_map": []})", StatusCode::kCorrupt, "\"weight_map\" is not an object");
  expect(R"({"weight_map": {}})", StatusCode::kCorrupt, "lists no tensors");
  expect(R"({"weight_map": {"a": 3}})", StatusCode::kCorrupt,
         "tensor 'a' maps to a number, not a file name");
  expect(R"({"weight_map": {"a": "model.safetensors"}, "metadata": 1})", StatusCode::kCorrupt,
         "\"metadata\" is not an object");
  expect(R"({"weight_map": {"a": "model.safetensors"}, "extra": 1})", StatusCode::kCorrupt,
         "unknown key 'extra'");
  expect(R"({"weight_map": {"a": "model.safetensors", "a": "model.safetensors"}})",
         StatusCode::kCorrupt, "duplicate key 'a' inside 'weight_map'");
  expect(R"({"weight_map": {"a": "model.safetensors"}, "weight_map": {}})", StatusCode::kCorrupt,
         "duplicate key 'weight_map' at the top level");
  expect(R"({"weight_map": {"../a": "model.safetensors"}})", StatusCode::kCorrupt,
         "tensor name '../a' contains a path separator");
  // And the well-formed version of the same index is accepted.
  WriteIndex(R"({"metadata": {"total_size": 4}, "weight_map": {"a": "model.safetensors"}})");
  EXPECT_TRUE(ReadCheckpointLayout(dir_.path()).ok());
}

}  // namespace
}  // namespace deltacast::apply
