#include "apply/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/file_util.h"
#include "tests/apply/test_util.h"

namespace deltacast::apply {
namespace {

using ::deltacast::apply::testing::Pattern;
using ::deltacast::apply::testing::ReadAll;
using ::deltacast::apply::testing::ScratchDir;
using ::deltacast::apply::testing::WriteRawSafetensors;
using ::testing::HasSubstr;

constexpr DType kAllDTypes[] = {
    DType::kBool, DType::kU8,  DType::kI8,  DType::kF8E4M3, DType::kF8E5M2,
    DType::kI16,  DType::kU16, DType::kF16, DType::kBF16,   DType::kI32,
    DType::kU32,  DType::kF32, DType::kI64, DType::kU64,    DType::kF64,
};

class SafetensorsTest : public ::testing::Test {
 protected:
  std::filesystem::path File(const std::string& name) const { return dir_.path() / name; }

  // Writes `json` (padded to a multiple of 8, as writers do) plus `data_bytes`
  // bytes of data, and parses it back.
  Result<SafetensorsHeader> ParseRaw(std::string json, size_t data_bytes) {
    json.resize((json.size() + 7) / 8 * 8, ' ');
    const auto path = File("raw.safetensors");
    WriteRawSafetensors(path, json, Pattern(data_bytes, 1));
    return ReadSafetensorsHeader(path);
  }

  // Asserts `result` failed with `code` and a message containing `substring`.
  template <typename T>
  static void ExpectError(const Result<T>& result, StatusCode code, const std::string& substring) {
    ASSERT_FALSE(result.ok()) << "expected an error containing \"" << substring << "\"";
    EXPECT_EQ(result.status().code(), code) << result.status().ToString();
    EXPECT_THAT(result.status().message(), HasSubstr(substring));
  }

  static void ExpectError(const Status& status, StatusCode code, const std::string& substring) {
    ASSERT_FALSE(status.ok()) << "expected an error containing \"" << substring << "\"";
    EXPECT_EQ(status.code(), code) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr(substring));
  }

  ScratchDir dir_;
};

TEST_F(SafetensorsTest, RoundTripEveryDTypeIncludingEmptyTensors) {
  std::vector<codec::TensorInfo> tensors;
  for (DType dtype : kAllDTypes) {
    const std::string name(DTypeName(dtype));
    tensors.push_back({"model.layers.0." + name + ".weight", dtype, {3, 5}});
    tensors.push_back({"scalar." + name, dtype, {}});
    tensors.push_back({"empty." + name, dtype, {0}});
    tensors.push_back({"empty2d." + name, dtype, {4, 0}});
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "a \"q\" \\"}};
  const auto path = File("all.safetensors");

  std::vector<std::byte> data;
  {
    auto writer = SafetensorsWriter::Create(path, tensors, metadata);
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    uint32_t seed = 0;
    for (const auto& t : tensors) {
      const auto bytes = Pattern(t.ByteSize(), ++seed);
      data.insert(data.end(), bytes.begin(), bytes.end());
      // Uneven slices: the writer must not care where Append calls fall.
      for (size_t at = 0; at < bytes.size(); at += 7) {
        const size_t n = std::min<size_t>(7, bytes.size() - at);
        ASSERT_TRUE((*writer)->Append(ByteSpan(bytes).subspan(at, n)).ok());
      }
    }
    ASSERT_TRUE((*writer)->Finish().ok());
  }

  auto header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->metadata, metadata);
  EXPECT_EQ((header->data_section_offset - 8) % 8, 0u);
  ASSERT_EQ(header->entries.size(), tensors.size());
  // Entries come back in data order, which is the order they were written in,
  // except that an empty tensor sorts before a non-empty one at the same offset.
  std::map<std::string, SafetensorsEntry> by_name;
  for (const auto& e : header->entries) by_name[e.info.name] = e;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    ASSERT_EQ(by_name.count(t.name), 1u) << t.name;
    const auto& e = by_name[t.name];
    EXPECT_EQ(e.info, t);
    EXPECT_EQ(e.data_begin, offset) << t.name;
    EXPECT_EQ(e.data_end, offset + t.ByteSize()) << t.name;
    offset += t.ByteSize();
  }
  for (size_t i = 1; i < header->entries.size(); ++i) {
    EXPECT_LE(header->entries[i - 1].data_end, header->entries[i].data_begin);
  }

  const std::string file = ReadAll(path);
  ASSERT_EQ(file.size(), header->data_section_offset + data.size());
  EXPECT_EQ(file.substr(header->data_section_offset), std::string(AsChars(data)));
}

TEST_F(SafetensorsTest, SerializedHeaderIsCompactPaddedJsonWithMetadataFirst) {
  const std::vector<codec::TensorInfo> tensors = {{"b", DType::kBF16, {2}},
                                                  {"a", DType::kF32, {1, 1}}};
  const auto bytes = SerializeSafetensorsHeader(tensors, {{"format", "pt"}});
  ASSERT_GE(bytes.size(), 8u);
  const uint64_t n = LoadLE<uint64_t>(bytes.data());
  EXPECT_EQ(n, bytes.size() - 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string json(AsChars(ByteSpan(bytes).subspan(8)));
  const std::string expected =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
      R"("a":{"dtype":"F32","shape":[1,1],"data_offsets":[4,8]}})";
  EXPECT_EQ(json.substr(0, expected.size()), expected);
  EXPECT_EQ(json.find_first_not_of(' ', expected.size()), std::string::npos);

  // Without metadata there is no __metadata__ key at all.
  const auto plain = SerializeSafetensorsHeader(tensors, {});
  EXPECT_THAT(std::string(AsChars(plain)), ::testing::Not(HasSubstr("__metadata__")));
}

TEST_F(SafetensorsTest, FileWithoutTensors) {
  const auto path = File("none.safetensors");
  auto writer = SafetensorsWriter::Create(path, {});
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  auto header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_TRUE(header->entries.empty());
  EXPECT_EQ(header->data_section_offset, 16u);  // "{}" padded to 8
}

TEST_F(SafetensorsTest, AcceptsPrettyPrintedHeaderAndZeroExtentWithHugeExtents) {
  auto header = ParseRaw(
      "{\n  \"a\": {\"dtype\": \"F64\", \"shape\": [0, 9223372036854775808, 4],\n"
      "         \"data_offsets\": [0, 0]},\n"
      "  \"b\": {\"data_offsets\": [0, 2], \"shape\": [1], \"dtype\": \"BF16\"}\n}\n",
      2);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  ASSERT_EQ(header->entries.size(), 2u);
  EXPECT_EQ(header->entries[0].info.name, "a");
  EXPECT_EQ(header->entries[0].info.ByteSize(), 0u);
  EXPECT_EQ(header->entries[1].info.name, "b");
}

TEST_F(SafetensorsTest, HeaderBytesNeededAndShortPrefix) {
  const auto bytes = SerializeSafetensorsHeader({{"a", DType::kU8, {3}}}, {});
  auto needed = HeaderBytesNeeded(bytes, bytes.size() + 3);
  ASSERT_TRUE(needed.ok());
  EXPECT_EQ(*needed, bytes.size());
  ExpectError(ParseSafetensorsHeader(ByteSpan(bytes).first(12), bytes.size() + 3),
              StatusCode::kInvalidArgument, "needs the first " + std::to_string(bytes.size()));
  EXPECT_TRUE(ParseSafetensorsHeader(bytes, bytes.size() + 3).ok());
}

// ---- Writer misuse ----

TEST_F(SafetensorsTest, WriterChecksByteCount) {
  const auto path = File("w.safetensors");
  auto writer = SafetensorsWriter::Create(path, {{"a", DType::kF32, {2}}});
  ASSERT_TRUE(writer.ok());
  const auto data = Pattern(8, 3);
  ExpectError((*writer)->Append(Pattern(9, 1)), StatusCode::kInvalidArgument,
              "exceed the declared 8 bytes");
  ASSERT_TRUE((*writer)->Append(ByteSpan(data).first(4)).ok());
  ExpectError((*writer)->Finish(), StatusCode::kFailedPrecondition, "4 of 8 bytes");
  ASSERT_TRUE((*writer)->Append(ByteSpan(data).subspan(4)).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  ExpectError((*writer)->Append(data), StatusCode::kFailedPrecondition, "already finished");
  EXPECT_TRUE(ReadSafetensorsHeader(path).ok());
}

TEST_F(SafetensorsTest, WriterRefusesTensorsTheParserWouldRefuse) {
  const auto path = File("w.safetensors");
  auto expect_refused = [&](std::vector<codec::TensorInfo> tensors, const std::string& substring) {
    auto writer = SafetensorsWriter::Create(path, tensors);
    ExpectError(writer, StatusCode::kInvalidArgument, substring);
  };
  expect_refused({{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}}, "duplicate tensor name 'a'");
  expect_refused({{"../x", DType::kU8, {1}}}, "path separator");
  expect_refused({{"..", DType::kU8, {1}}}, "path component");
  expect_refused({{"", DType::kU8, {1}}}, "empty");
  expect_refused({{"__metadata__", DType::kU8, {1}}}, "reserved");
  expect_refused({{"big", DType::kF32, {1ull << 62}}}, "overflows 64 bits");
}

// ---- Malformed files: each class has its own error ----

TEST_F(SafetensorsTest, FileTooSmallForLength) {
  const auto path = File("tiny.safetensors");
  ASSERT_TRUE(WriteFile(path, Pattern(5, 1)).ok());
  ExpectError(ReadSafetensorsHeader(path), StatusCode::kCorrupt, "too small for the 8-byte");
}

TEST_F(SafetensorsTest, HeaderLengthLargerThanCap) {
  const auto path = File("cap.safetensors");
  WriteRawSafetensors(path, "{}      ", {}, kMaxSafetensorsHeaderBytes + 1);
  ExpectError(ReadSafetensorsHeader(path), StatusCode::kCorrupt,
              "header length 104857601 exceeds the limit");
  // The cap is checked even when the length would fit in the file.
  std::vector<std::byte> first8(8);
  StoreLE<uint64_t>(first8.data(), kMaxSafetensorsHeaderBytes + 1);
  ExpectError(HeaderBytesNeeded(first8, 1ull << 40), StatusCode::kCorrupt, "exceeds the limit");
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFileSize) {
  const auto path = File("short.safetensors");
  WriteRawSafetensors(path, "{}      ", {}, 1000);
  auto result = ReadSafetensorsHeader(path);
  ExpectError(result, StatusCode::kCorrupt, "header length 1000 runs past the end of the 16-byte");
  EXPECT_THAT(result.status().message(), HasSubstr("short.safetensors"));
}

TEST_F(SafetensorsTest, TruncatedJson) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"F32","shape":[1])", 4), StatusCode::kCorrupt,
              "ill-formed JSON");
}

TEST_F(SafetensorsTest, IllFormedJson) {
  ExpectError(ParseRaw(R"({"a" {"dtype":"F32"}})", 0), StatusCode::kCorrupt, "ill-formed JSON");
  ExpectError(ParseRaw("{} {}", 0), StatusCode::kCorrupt, "ill-formed JSON");
  ExpectError(ParseRaw("", 0), StatusCode::kCorrupt, "ill-formed JSON");
  ExpectError(ParseRaw("{\"a\xff\":1}", 0), StatusCode::kCorrupt, "ill-formed JSON");
}

TEST_F(SafetensorsTest, TopLevelNotAnObject) {
  ExpectError(ParseRaw("[1, 2]", 0), StatusCode::kCorrupt, "header is array, not a JSON object");
}

TEST_F(SafetensorsTest, DuplicateTopLevelKey) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                       2),
              StatusCode::kCorrupt, "duplicate key 'a' at the top level");
}

TEST_F(SafetensorsTest, DuplicateKeyInsideEntry) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[1],"dtype":"U8","data_offsets":[0,1]}})", 1),
              StatusCode::kCorrupt, "duplicate key 'dtype' inside 'a'");
}

TEST_F(SafetensorsTest, DuplicateKeyInsideMetadata) {
  ExpectError(ParseRaw(R"({"__metadata__":{"k":"1","k":"2"}})", 0), StatusCode::kCorrupt,
              "duplicate key 'k' inside '__metadata__'");
}

TEST_F(SafetensorsTest, UnknownDType) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}})", 2),
              StatusCode::kCorrupt, "tensor 'a': unknown dtype 'bf16'");
  ExpectError(ParseRaw(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16),
              StatusCode::kCorrupt, "unknown dtype 'F128'");
  ExpectError(ParseRaw(R"({"a":{"dtype":9,"shape":[1],"data_offsets":[0,2]}})", 2),
              StatusCode::kCorrupt, "dtype '9' is not a string");
}

TEST_F(SafetensorsTest, UnknownOrMissingEntryField) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":0}})", 1),
              StatusCode::kCorrupt, "tensor 'a': unknown field 'extra'");
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", 1), StatusCode::kCorrupt,
              "tensor 'a': missing field 'shape'");
  ExpectError(ParseRaw(R"({"a":[1]})", 1), StatusCode::kCorrupt, "not an object");
}

TEST_F(SafetensorsTest, NegativeOrNonIntegerShape) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0),
              StatusCode::kCorrupt, "has '-1', not a non-negative integer");
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", 2),
              StatusCode::kCorrupt, "has '2.0', not a non-negative integer");
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}})", 2),
              StatusCode::kCorrupt, "not a non-negative integer");
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[1e2],"data_offsets":[0,100]}})", 100),
              StatusCode::kCorrupt, "not a non-negative integer");
  // Larger than any uint64: nlohmann reads it as a float.
  ExpectError(
      ParseRaw(R"({"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,0]}})", 0),
      StatusCode::kCorrupt, "not a non-negative integer");
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":4,"data_offsets":[0,4]}})", 4),
              StatusCode::kCorrupt, "shape '4' is not a list");
}

TEST_F(SafetensorsTest, ShapeProductOverflow) {
  // 2^32 * 2^32 elements overflows the element count itself.
  ExpectError(
      ParseRaw(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
      StatusCode::kCorrupt, "shape [4294967296, 4294967296] of U8 overflows 64 bits");
  // 2^62 elements fit; 2^62 * 4 bytes do not.
  ExpectError(
      ParseRaw(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0),
      StatusCode::kCorrupt, "overflows 64 bits");
}

TEST_F(SafetensorsTest, MalformedDataOffsets) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
              StatusCode::kCorrupt, "is not a [begin, end] pair");
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,-1]}})", 1),
              StatusCode::kCorrupt, "must hold non-negative integers");
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", 8),
              StatusCode::kCorrupt, "data_offsets [8, 4] ends before it begins");
}

TEST_F(SafetensorsTest, OffsetsOutOfBounds) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", 16),
              StatusCode::kCorrupt, "tensor 'a': data_offsets [0, 32] run past the 16-byte data");
  // Huge offsets must not wrap around.
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[1],)"
                       R"("data_offsets":[18446744073709551615,18446744073709551615]}})",
                       1),
              StatusCode::kCorrupt, "span 0 bytes but shape [1] of U8 needs 1");
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[0],)"
                       R"("data_offsets":[18446744073709551615,18446744073709551615]}})",
                       1),
              StatusCode::kCorrupt, "run past the 1-byte data section");
}

TEST_F(SafetensorsTest, SizeMismatchWithShape) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", 12),
              StatusCode::kCorrupt,
              "tensor 'a': data_offsets [0, 12] span 12 bytes but shape [2] of F32 needs 8");
}

TEST_F(SafetensorsTest, GapBetweenTensors) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"U8","shape":[8],"data_offsets":[12,20]}})",
                       20),
              StatusCode::kCorrupt, "gap of 4 bytes before tensor 'b'");
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", 12),
              StatusCode::kCorrupt, "gap of 4 bytes before tensor 'a'");
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                       12),
              StatusCode::kCorrupt, "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a'");
  // Two tensors on the very same bytes.
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
                       8),
              StatusCode::kCorrupt, "overlaps tensor 'a'");
}

TEST_F(SafetensorsTest, TrailingBytes) {
  ExpectError(ParseRaw(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 10),
              StatusCode::kCorrupt, "2 trailing bytes after the last tensor");
  ExpectError(ParseRaw("{}", 3), StatusCode::kCorrupt, "3 trailing bytes");
}

TEST_F(SafetensorsTest, PathLikeOrControlNames) {
  auto entry = [](const std::string& json_name) {
    return "{\"" + json_name + R"(":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  };
  ExpectError(ParseRaw(entry("../x"), 1), StatusCode::kCorrupt,
              "tensor name '../x' contains a path separator");
  ExpectError(ParseRaw(entry("a/b"), 1), StatusCode::kCorrupt,
              "tensor name 'a/b' contains a path separator");
  ExpectError(ParseRaw(entry("a\\\\b"), 1), StatusCode::kCorrupt, "contains a path separator");
  ExpectError(ParseRaw(entry(".."), 1), StatusCode::kCorrupt, "'..' is a path component");
  ExpectError(ParseRaw(entry("."), 1), StatusCode::kCorrupt, "'.' is a path component");
  ExpectError(ParseRaw(entry(""), 1), StatusCode::kCorrupt, "tensor name is empty");
  ExpectError(ParseRaw(entry("a\\u0000b"), 1), StatusCode::kCorrupt,
              "'a\\x00b' contains a control character");
  ExpectError(ParseRaw(entry("a\\nb"), 1), StatusCode::kCorrupt, "contains a control character");
  // Dots inside a name are how Hugging Face names tensors.
  EXPECT_TRUE(ParseRaw(entry("model..weird...name."), 1).ok());
}

TEST_F(SafetensorsTest, BadMetadata) {
  ExpectError(ParseRaw(R"({"__metadata__":["pt"]})", 0), StatusCode::kCorrupt,
              "__metadata__ is '[\"pt\"]', not an object");
  ExpectError(ParseRaw(R"({"__metadata__":{"format":1}})", 0), StatusCode::kCorrupt,
              "__metadata__ value for 'format' is '1', not a string");
  ExpectError(ParseRaw(R"({"__metadata__":{"nested":{"a":"b"}}})", 0), StatusCode::kCorrupt,
              "not a string");
}

TEST_F(SafetensorsTest, DeeplyNestedJson) {
  ExpectError(
      ParseRaw("{\"__metadata__\":" + std::string(200, '[') + std::string(200, ']') + "}", 0),
      StatusCode::kCorrupt, "nested deeper than 64 levels");
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  ExpectError(ReadSafetensorsHeader(File("absent.safetensors")), StatusCode::kNotFound,
              "absent.safetensors");
}

}  // namespace
}  // namespace deltacast::apply
