#include "apply/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
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
    DType::kBool,   DType::kU8,         DType::kI8,         DType::kF8E4M3, DType::kF8E5M2,
    DType::kI16,    DType::kU16,        DType::kF16,        DType::kBF16,   DType::kI32,
    DType::kU32,    DType::kF32,        DType::kI64,        DType::kU64,    DType::kF64,
    DType::kF8E8M0, DType::kF8E4M3Fnuz, DType::kF8E5M2Fnuz, DType::kC64,
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
  std::vector<TensorSpec> tensors;
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
  const std::vector<TensorSpec> tensors = {{"b", DType::kBF16, {2}}, {"a", DType::kF32, {1, 1}}};
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
  auto expect_refused = [&](std::vector<TensorSpec> tensors, const std::string& substring) {
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

// ---- The reference's rules, one by one (safetensors::SafeTensors::read_metadata) ----
// Each test says what the reference does with the input; deltacast must agree.

// A file of raw bytes (no padding added): the header length is what `json` is.
class ReferenceRulesTest : public SafetensorsTest {
 protected:
  Result<SafetensorsHeader> Exact(const std::string& json, size_t data_bytes) {
    std::vector<std::byte> file(8 + json.size() + data_bytes);
    StoreLE<uint64_t>(file.data(), json.size());
    std::memcpy(file.data() + 8, json.data(), json.size());
    return ParseSafetensorsHeader(file, file.size());
  }
  static constexpr char kU8x4[] = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
};

// HeaderTooSmall: fewer than 8 bytes.
TEST_F(ReferenceRulesTest, HeaderTooSmall) {
  std::vector<std::byte> seven(7);
  ExpectError(ParseSafetensorsHeader(seven, 7), StatusCode::kCorrupt, "too small");
}

// HeaderTooLarge: the length prefix above 100,000,000 (decimal: 100 MiB is too large).
TEST_F(ReferenceRulesTest, HeaderTooLargeIsDecimalHundredMillion) {
  std::vector<std::byte> prefix(8);
  StoreLE<uint64_t>(prefix.data(), 100'000'001);
  ExpectError(ParseSafetensorsHeader(prefix, 200'000'000), StatusCode::kCorrupt,
              "header length 100000001 exceeds the limit of 100000000");
  StoreLE<uint64_t>(prefix.data(), 100'000'000);
  EXPECT_TRUE(HeaderBytesNeeded(prefix, 200'000'000).ok());
  StoreLE<uint64_t>(prefix.data(), ~uint64_t{0});  // n + 8 would wrap
  ExpectError(ParseSafetensorsHeader(prefix, 16), StatusCode::kCorrupt, "exceeds the limit");
}

// InvalidHeaderLength: 8 + n beyond the file.
TEST_F(ReferenceRulesTest, HeaderLengthBeyondTheFile) {
  std::vector<std::byte> file(20);
  StoreLE<uint64_t>(file.data(), 13);
  ExpectError(ParseSafetensorsHeader(file, file.size()), StatusCode::kCorrupt, "runs past the end");
}

// InvalidHeader: not UTF-8 (overlong forms and surrogates included); and serde_json
// does not skip a byte order mark, though nlohmann would.
TEST_F(ReferenceRulesTest, HeaderMustBeUtf8WithoutByteOrderMark) {
  ExpectError(Exact("{\"\xff\":1}", 0), StatusCode::kCorrupt, "not valid UTF-8");
  ExpectError(Exact("{\"\xc0\xaf\":1}", 0), StatusCode::kCorrupt, "not valid UTF-8");
  ExpectError(Exact("{\"\xed\xa0\x80\":1}", 0), StatusCode::kCorrupt, "not valid UTF-8");
  ExpectError(Exact("\xef\xbb\xbf{}", 0), StatusCode::kCorrupt, "byte order mark");
  // Valid UTF-8 names are fine, whatever the script.
  auto ok = Exact(R"({"w\u00e9ight.\u4e00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->entries[0].info.name, "w\xc3\xa9ight.\xe4\xb8\x80");
}

// InvalidHeaderDeserialization: what serde_json refuses. Leading and trailing JSON
// whitespace is fine (the writer pads with spaces); anything else around is not.
TEST_F(ReferenceRulesTest, JsonAsSerdeReadsIt) {
  EXPECT_TRUE(Exact(std::string(" \t\r\n") + kU8x4 + "   ", 4).ok());
  ExpectError(Exact(std::string(kU8x4) + "x", 4), StatusCode::kCorrupt, "ill-formed JSON");
  ExpectError(Exact(std::string(kU8x4) + std::string(3, '\0'), 4), StatusCode::kCorrupt,
              "ill-formed JSON");
  ExpectError(Exact("", 0), StatusCode::kCorrupt, "ill-formed JSON");
  ExpectError(Exact("[]", 0), StatusCode::kCorrupt, "not a JSON object");
  ExpectError(Exact(R"({"a":{"dtype":"U8",})", 0), StatusCode::kCorrupt, "ill-formed JSON");
  ExpectError(Exact("{/*c*/}", 0), StatusCode::kCorrupt, "ill-formed JSON");  // no comments
  ExpectError(Exact("{\"a\":\"\\ud800\"}", 0), StatusCode::kCorrupt, "ill-formed JSON");
  // serde_json nests 128 deep; inside an ignored field that is still read.
  const auto nested = [](int depth) {
    return R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":)" + std::string(depth, '[') +
           std::string(depth, ']') + "}}";
  };
  EXPECT_TRUE(Exact(nested(100), 1).ok());
  ExpectError(Exact(nested(200), 1), StatusCode::kCorrupt, "nested deeper than 128");
}

// Entries: serde's derived struct reads an object (fields it does not know are
// ignored) or a sequence of the three fields in order.
TEST_F(ReferenceRulesTest, EntryFieldsUnknownIgnoredOrderFreeOrAsArray) {
  auto extra = Exact(
      R"({"a":{"extra":[1,{"y":2}],"data_offsets":[0,4],"shape":[4],"dtype":"U8","z":null}})", 4);
  ASSERT_TRUE(extra.ok()) << extra.status().ToString();
  EXPECT_EQ(extra->entries[0].info.shape, (std::vector<uint64_t>{4}));
  auto array = Exact(R"({"a":["U8",[2,2],[0,4]]})", 4);
  ASSERT_TRUE(array.ok()) << array.status().ToString();
  EXPECT_EQ(array->entries[0].info.shape, (std::vector<uint64_t>{2, 2}));
  ExpectError(Exact(R"({"a":["U8",[4]]})", 4), StatusCode::kCorrupt, "not an object");
  ExpectError(Exact(R"({"a":["U8",[4],[0,4],1]})", 4), StatusCode::kCorrupt, "not an object");
  ExpectError(Exact(R"({"a":{"shape":[4],"data_offsets":[0,4]}})", 4), StatusCode::kCorrupt,
              "missing field 'dtype'");
  ExpectError(Exact(R"({"a":4})", 0), StatusCode::kCorrupt, "not an object");
  // A field the struct knows may not come twice.
  ExpectError(Exact(R"({"a":{"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4),
              StatusCode::kCorrupt, "duplicate field 'dtype' in tensor 'a'");
  // An ignored one may.
  EXPECT_TRUE(
      Exact(R"({"a":{"x":1,"x":2,"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4).ok());
}

// A tensor named twice: the reference's map keeps the last entry, but reads (and so
// validates) every one.
TEST_F(ReferenceRulesTest, ATensorNamedTwiceKeepsItsLastEntry) {
  auto twice = Exact(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                     R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                     4);
  ASSERT_TRUE(twice.ok()) << twice.status().ToString();
  ASSERT_EQ(twice->entries.size(), 1u);
  EXPECT_EQ(twice->entries[0].data_end, 4u);
  ExpectError(Exact(R"({"a":{"dtype":"Q9","shape":[8],"data_offsets":[0,8]},)"
                    R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                    4),
              StatusCode::kCorrupt, "unknown dtype 'Q9'");
}

// dtypes: the reference's names, exact case; an enum may also be {"NAME": null}.
// Its sub-byte dtypes are valid files deltacast cannot carry: kUnsupported.
TEST_F(ReferenceRulesTest, DTypes) {
  for (const char* name :
       {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",
        "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"}) {
    const auto dtype = ParseDType(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    const size_t e = ElementSize(*dtype);
    auto h = Exact(std::string(R"({"t":{"dtype":")") + name +
                       R"(","shape":[3],"data_offsets":[0,)" + std::to_string(3 * e) + "]}}",
                   3 * e);
    EXPECT_TRUE(h.ok()) << name << ": " << h.status().ToString();
  }
  EXPECT_TRUE(Exact(R"({"t":{"dtype":{"U8":null},"shape":[4],"data_offsets":[0,4]}})", 4).ok());
  ExpectError(Exact(R"({"t":{"dtype":"u8","shape":[4],"data_offsets":[0,4]}})", 4),
              StatusCode::kCorrupt, "unknown dtype 'u8'");
  ExpectError(Exact(R"({"t":{"dtype":9,"shape":[4],"data_offsets":[0,4]}})", 4),
              StatusCode::kCorrupt, "is not a dtype name");
  ExpectError(Exact(R"({"t":{"dtype":"F4","shape":[8],"data_offsets":[0,4]}})", 4),
              StatusCode::kUnsupported, "narrower than a byte");
}

// shape and data_offsets are usize: non-negative integers that fit 64 bits ("-0" is
// 0 to serde_json); floats, negatives and strings are refused; offsets are a pair.
TEST_F(ReferenceRulesTest, ShapesAndOffsetsAreUnsignedIntegers) {
  EXPECT_TRUE(Exact(R"({"t":{"dtype":"U8","shape":[-0,4],"data_offsets":[0,0]}})", 0).ok());
  for (const char* shape : {"[1.0]", "[-1]", "[\"4\"]", "[1e0]", "[18446744073709551616]", "4"}) {
    ExpectError(
        Exact(std::string(R"({"t":{"dtype":"U8","shape":)") + shape + R"(,"data_offsets":[0,1]}})",
              1),
        StatusCode::kCorrupt, "shape");
  }
  for (const char* offsets : {"[0]", "[0,1,2]", "[0,1.0]", "[-1,0]", "{\"0\":0}"}) {
    ExpectError(
        Exact(std::string(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":)") + offsets + "}}", 1),
        StatusCode::kCorrupt, "data_offsets");
  }
  // An empty shape is a scalar: one element.
  EXPECT_TRUE(Exact(R"({"t":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4).ok());
}

// ValidationOverflow: the element count folds left to right, each step checked, and
// the bit count after it, so a zero extent after two huge ones still overflows.
TEST_F(ReferenceRulesTest, ShapeProductOverflowsAsTheReferenceFoldsIt) {
  EXPECT_TRUE(
      Exact(R"({"t":{"dtype":"F64","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", 0)
          .ok());
  ExpectError(
      Exact(R"({"t":{"dtype":"F64","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", 0),
      StatusCode::kCorrupt, "overflows 64 bits");
  // 2^61 one-byte elements fit 64 bits of bytes but not of bits.
  ExpectError(
      Exact(R"({"t":{"dtype":"U8","shape":[2305843009213693952],"data_offsets":[0,0]}})", 0),
      StatusCode::kCorrupt, "overflows 64 bits");
}

// InvalidOffset / TensorInvalidInfo / MetadataIncompleteBuffer: in offset order each
// tensor starts where the previous ended and spans exactly its bytes; together they
// cover the data section to its last byte. No alignment is required.
TEST_F(ReferenceRulesTest, OffsetsAreContiguousExactAndCoverTheData) {
  EXPECT_TRUE(Exact(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[1,5]},)"
                    R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                    5)
                  .ok())
      << "unaligned F32 at offset 1, entries out of order";
  ExpectError(Exact(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2),
              StatusCode::kCorrupt, "gap of 1 bytes");
  ExpectError(Exact(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                    4),
              StatusCode::kCorrupt, "overlaps");
  ExpectError(Exact(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,3]}})", 3),
              StatusCode::kCorrupt, "span 3 bytes but shape [2] of U8 needs 2");
  ExpectError(Exact(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 3),
              StatusCode::kCorrupt, "1 trailing bytes");
  ExpectError(Exact(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 2),
              StatusCode::kCorrupt, "past the 2-byte data section");
  ExpectError(Exact(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                    R"("b":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})",
                    1),
              StatusCode::kCorrupt, "gap");
  // Empty tensors anywhere, several at one offset.
  EXPECT_TRUE(Exact(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
                    R"("b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                    R"("c":{"dtype":"F32","shape":[0,3],"data_offsets":[2,2]}})",
                    2)
                  .ok());
  // No tensors: the data section must be empty.
  EXPECT_TRUE(Exact("{}", 0).ok());
  ExpectError(Exact("{}", 1), StatusCode::kCorrupt, "trailing");
}

// __metadata__: Option<HashMap<String, String>>: null is none, duplicate keys keep
// the last, values must be strings; the field itself may appear once.
TEST_F(ReferenceRulesTest, Metadata) {
  EXPECT_TRUE(Exact(R"({"__metadata__":null})", 0).ok());
  auto dup = Exact(R"({"__metadata__":{"k":"1","k":"2"}})", 0);
  ASSERT_TRUE(dup.ok()) << dup.status().ToString();
  EXPECT_EQ(dup->metadata.at("k"), "2");
  ExpectError(Exact(R"({"__metadata__":{"k":1}})", 0), StatusCode::kCorrupt, "not a string");
  ExpectError(Exact(R"({"__metadata__":[]})", 0), StatusCode::kCorrupt, "not an object");
  ExpectError(Exact(R"({"__metadata__":{},"__metadata__":{}})", 0), StatusCode::kCorrupt,
              "duplicate key '__metadata__'");
}

// Names: the reference takes any string. Those deltacast cannot carry in a chunk
// record (empty, over 1024 bytes) are valid but unsupported; the rest, including
// separators and control characters, are kept as they are (and escaped in logs).
TEST_F(ReferenceRulesTest, TensorNames) {
  auto odd = Exact(R"({"../x\n":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  ASSERT_TRUE(odd.ok()) << odd.status().ToString();
  EXPECT_EQ(odd->entries[0].info.name, "../x\n");
  ExpectError(Exact(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1),
              StatusCode::kUnsupported, "1 to 1024 bytes");
  ExpectError(Exact("{\"" + std::string(1025, 'n') +
                        R"(":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                    1),
              StatusCode::kUnsupported, "1 to 1024 bytes");
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  ExpectError(ReadSafetensorsHeader(File("absent.safetensors")), StatusCode::kNotFound,
              "absent.safetensors");
}

}  // namespace
}  // namespace deltacast::apply
