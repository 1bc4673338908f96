#include "core/io/safetensors.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/bfloat16.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::core {
namespace {

using ::testing::HasSubstr;

// A file from a hand-written header and a data section, bypassing the serializer so
// that the header can be anything.
std::string RawFile(const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  const uint64_t size = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((size >> (8 * i)) & 0xFF);
  return bytes + header + data;
}

std::string FloatBytes(std::initializer_list<float> values) {
  std::string bytes(values.size() * 4, '\0');
  std::memcpy(bytes.data(), values.begin(), bytes.size());
  return bytes;
}

void ExpectInvalid(const std::string& bytes, const std::string& words) {
  const absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(bytes);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
  EXPECT_THAT(file.status().message(), HasSubstr(words));
}

TEST(SafetensorsTest, RoundTripsThroughSerializer) {
  const std::vector<SafetensorsEntry> entries = {
      {"b", "F32", {2}, FloatBytes({1.5f, -2.0f})},
      {"a", "BF16", {1, 2}, std::string("\x80\x3f\x00\xc0", 4)},  // 1.0, -2.0
  };
  const absl::StatusOr<std::string> bytes = SerializeSafetensors(entries);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ((bytes->size() - 8 - 6) % 2, 0u);
  const absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(file->Names(), ::testing::ElementsAre("a", "b"));
  EXPECT_THAT(*file->ReadFloat32("b"), ::testing::ElementsAre(1.5f, -2.0f));
  EXPECT_THAT(*file->ReadFloat32("a", {1, 2}), ::testing::ElementsAre(1.0f, -2.0f));
}

TEST(SafetensorsTest, ReadsMetadataAndEscapedNames) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"x\u0041\n":{"dtype":"F32","shape":[1],)"
      R"("data_offsets":[0,4]}})";
  const absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Parse(RawFile(header, FloatBytes({3.0f})));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_NE(file->Find("xA\n"), nullptr);
}

TEST(SafetensorsTest, MissingTensorIsNotFoundAndNamed) {
  const absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(RawFile("{}", ""));
  ASSERT_TRUE(file.ok());
  const auto values = file->ReadFloat32("in_proj_weight");
  EXPECT_EQ(values.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(values.status().message(), HasSubstr("missing tensor 'in_proj_weight'"));
}

TEST(SafetensorsTest, WrongShapeSaysExpectedAndFound) {
  const auto file = SafetensorsFile::Parse(RawFile(
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", FloatBytes({1, 2})));
  ASSERT_TRUE(file.ok());
  const auto values = file->ReadFloat32("w", {3});
  EXPECT_EQ(values.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(values.status().message(),
              HasSubstr("wrong shape: expected [3], found [2]"));
}

TEST(SafetensorsTest, WrongDtypeIsRejected) {
  const auto file = SafetensorsFile::Parse(RawFile(
      R"({"w":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')));
  ASSERT_TRUE(file.ok());
  const auto values = file->ReadFloat32("w");
  EXPECT_EQ(values.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(values.status().message(),
              HasSubstr("wrong dtype: expected F32 or BF16, found I32"));
}

TEST(SafetensorsTest, UnknownDtypeIsRejected) {
  ExpectInvalid(RawFile(R"({"w":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})",
                        std::string(4, '\0')),
                "unknown dtype 'F17'");
}

TEST(SafetensorsTest, TruncatedDataIsRejected) {
  ExpectInvalid(RawFile(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                        FloatBytes({1, 2})),
                "out of range: the data section has only 8 bytes (truncated file?)");
}

TEST(SafetensorsTest, FileShorterThanLengthFieldIsRejected) {
  ExpectInvalid(std::string("\x10\x00\x00", 3), "shorter than the 8-byte header length");
}

TEST(SafetensorsTest, HeaderLengthPastEndOfFileIsRejected) {
  std::string bytes = RawFile("{}", "");
  bytes[0] = 100;
  ExpectInvalid(bytes, "header length 100 runs past the end of the file");
  bytes[7] = '\x7f';  // a huge length must not wrap around
  ExpectInvalid(bytes, "runs past the end of the file");
}

TEST(SafetensorsTest, MalformedJsonIsRejectedWithPosition) {
  ExpectInvalid(RawFile(R"({"w": {"dtype": "F32",,})", ""),
                "malformed JSON header at byte");
  ExpectInvalid(RawFile(R"({"w": )", ""), "unexpected end of header");
  ExpectInvalid(RawFile(R"(["w"])", ""), "top level is not an object");
  ExpectInvalid(RawFile(R"({"a":1,"a":2})", ""), "duplicate key");
  ExpectInvalid(RawFile(std::string(100, '['), ""), "nesting too deep");
  ExpectInvalid(RawFile(R"({"w":{"dtype":"F32","dtype":"F32"}})", ""),
                "duplicate key 'dtype'");
}

TEST(SafetensorsTest, ManyKeysParseInLinearithmicTime) {
  // 200k tensors of zero bytes: a quadratic duplicate check would take minutes here.
  std::string header = "{";
  for (int i = 0; i < 200000; ++i) {
    absl::StrAppend(&header, i > 0 ? "," : "", "\"t", i,
                    "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}");
  }
  header += "}";
  const absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Parse(RawFile(header, ""));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->Names().size(), 200000u);
}

TEST(SafetensorsTest, GapsAndTrailingBytesAreRejected) {
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        FloatBytes({1, 2})),
                "data_offsets leave bytes [0, 4) before tensor 'a' unused");
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                        FloatBytes({1, 2, 3})),
                "data_offsets leave bytes [4, 8) before tensor 'b' unused");
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                        FloatBytes({1, 2})),
                "4 trailing bytes");
}

TEST(SafetensorsTest, NonIntegerNumbersAreRejected) {
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})",
                        FloatBytes({1})),
                "shape entry must be a non-negative integer");
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,1e400]}})",
                        FloatBytes({1})),
                "malformed JSON header");
}

TEST(SafetensorsTest, OverlappingOffsetsAreRejected) {
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        FloatBytes({1, 2, 3})),
                "data_offsets of tensors 'a' and 'b' overlap");
}

TEST(SafetensorsTest, OffsetsOutOfRangeAreRejected) {
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
                        FloatBytes({1, 2})),
                "out of range: begin is past end");
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})",
                        FloatBytes({1})),
                "data_offsets[0] must be a non-negative integer");
  ExpectInvalid(
      RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,99999999999999]}})",
              FloatBytes({1})),
      "out of range");
}

TEST(SafetensorsTest, OffsetsNotMatchingShapeAreRejected) {
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                        FloatBytes({1, 2})),
                "span 8 bytes but shape [3] of F32 needs 12");
}

TEST(SafetensorsTest, HugeShapeDoesNotOverflow) {
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                        R"("data_offsets":[0,0]}})",
                        ""),
                "shape too large");
}

TEST(SafetensorsTest, EntryWithoutFieldsIsRejected) {
  ExpectInvalid(RawFile(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", FloatBytes({1})),
                "tensor 'a': missing string field 'dtype'");
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[1]}})", FloatBytes({1})),
                "missing field 'data_offsets'");
}

// A file's tensors are read when asked for (a bf16 one through several chunks), again
// when asked for again; the open file outlives the file's name and every copy of the
// object.
TEST(SafetensorsTest, ReadFileReadsEachTensorWhenAskedFor) {
  std::vector<float> big(5 << 20);  // 20 MiB: more than two conversion chunks
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 9973) - 17.5f;
  std::string data(big.size() * 4, '\0');
  std::memcpy(data.data(), big.data(), data.size());
  const std::vector<SafetensorsEntry> entries = {
      {"big", "F32", {static_cast<int64_t>(big.size())}, data},
      {"small", "BF16", {2}, std::string("\x80\x3f\x00\xc0", 4)},
  };
  const std::string path = ::testing::TempDir() + "/mapped.safetensors";
  {
    std::FILE* out = std::fopen(path.c_str(), "wb");
    ASSERT_NE(out, nullptr);
    const std::string bytes = *SerializeSafetensors(entries);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), out), bytes.size());
    std::fclose(out);
  }
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(std::remove(path.c_str()), 0);  // the mapping keeps the bytes
  EXPECT_EQ(*file->ReadFloat32("big"), big);
  EXPECT_EQ(*file->ReadFloat32("big"), big);
  const SafetensorsFile copy = *file;
  file = absl::UnknownError("gone");
  EXPECT_EQ(*copy.ReadFloat32("big"), big);
  EXPECT_THAT(*copy.ReadFloat32("small"), ::testing::ElementsAre(1.0f, -2.0f));
  // As bf16 bits: F32 rounded to nearest even through the chunks, BF16 as stored.
  const absl::StatusOr<std::vector<uint16_t>> narrow = copy.ReadBfloat16("big");
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  ASSERT_EQ(narrow->size(), big.size());
  for (size_t i = 0; i < big.size(); i += 4099) {
    ASSERT_EQ((*narrow)[i], FloatToBf16(big[i])) << "value " << i;
  }
  EXPECT_EQ(narrow->back(), FloatToBf16(big.back()));
  EXPECT_THAT(*copy.ReadBfloat16("small", {2}), ::testing::ElementsAre(0x3f80, 0xc000));
}

TEST(SafetensorsTest, ReadBfloat16RoundsToNearestEvenAndChecksAsReadFloat32) {
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: even (1) wins; 1 +
  // 3 * 2^-8 rounds up to 1 + 2^-6.
  const std::vector<SafetensorsEntry> entries = {
      {"w", "F32", {3}, FloatBytes({1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -0.0f})}};
  const auto file = SafetensorsFile::Parse(*SerializeSafetensors(entries));
  ASSERT_TRUE(file.ok());
  EXPECT_THAT(*file->ReadBfloat16("w", {3}),
              ::testing::ElementsAre(0x3f80, 0x3f82, 0x8000));
  EXPECT_EQ(file->ReadBfloat16("w", {4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(file->ReadBfloat16("x").status().code(), absl::StatusCode::kNotFound);
}

// A file cut short after its header was read (rewritten in place while loading) is a
// DataLoss naming the file and the range, never a crash.
TEST(SafetensorsTest, AFileCutShortWhileLoadingIsAnErrorNotACrash) {
  std::vector<float> values(1 << 20, 0.25f);
  std::string data(values.size() * 4, '\0');
  std::memcpy(data.data(), values.data(), data.size());
  const std::string path = ::testing::TempDir() + "/cut.safetensors";
  const std::string bytes =
      *SerializeSafetensors({{"w", "F32", {static_cast<int64_t>(values.size())}, data}});
  {
    std::FILE* out = std::fopen(path.c_str(), "wb");
    ASSERT_NE(out, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), out), bytes.size());
    std::fclose(out);
  }
  const absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(truncate(path.c_str(), 100), 0);
  const auto read = file->ReadFloat32("w");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("changed while it was loading"));
  std::remove(path.c_str());
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  const auto file = SafetensorsFile::Read("/nonexistent/weights.safetensors");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("/nonexistent/weights.safetensors"));
}

}  // namespace
}  // namespace attnserve::core
