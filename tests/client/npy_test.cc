#include "client/npy.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Header(const std::string& dict, int version = 1) {
  std::string bytes = std::string("\x93NUMPY", 6);
  bytes.push_back(static_cast<char>(version));
  bytes.push_back('\0');
  if (version == 1) {
    bytes.push_back(static_cast<char>(dict.size()));
    bytes.push_back('\0');
  } else {
    for (int i = 0; i < 4; ++i)
      bytes.push_back(static_cast<char>((dict.size() >> (8 * i)) & 0xFF));
  }
  return bytes + dict;
}

void ExpectInvalid(const std::string& bytes, const std::string& words) {
  const auto array = ParseNpy(bytes);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().message(), HasSubstr(words));
}

TEST(NpyTest, RoundTripsShapeAndValues) {
  const std::vector<float> values = {1.5f, -2, 0, 3.25f, 7, 8};
  const auto array = ParseNpy(SerializeNpy({2, 3}, values));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->shape, ElementsAre(2, 3));
  EXPECT_EQ(array->values, values);
  const std::string bytes = SerializeNpy({4}, {1, 2, 3, 4});
  EXPECT_THAT(bytes, HasSubstr("'shape': (4,)"));
  EXPECT_EQ((bytes.size() - 16) % 64, 0u);  // header padded to 64 bytes as numpy does
}

TEST(NpyTest, ReadsVersionTwoHeaders) {
  const std::string bytes =
      Header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }\n", 2) +
      std::string("\x00\x00\x80\x3f", 4);
  const auto array = ParseNpy(bytes);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->values, ElementsAre(1.0f));
}

TEST(NpyTest, RejectsBadMagic) { ExpectInvalid("PK\x03\x04 not numpy", "bad magic"); }

TEST(NpyTest, RejectsOtherDtypes) {
  ExpectInvalid(Header("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }\n") +
                    std::string(8, '\0'),
                "dtype '<f8' is not supported; expected little-endian float32 '<f4'");
  ExpectInvalid(Header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }\n") +
                    std::string(4, '\0'),
                "'>f4'");
}

TEST(NpyTest, RejectsFortranOrder) {
  ExpectInvalid(Header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }\n") +
                    std::string(16, '\0'),
                "Fortran-order arrays are not supported");
}

TEST(NpyTest, RejectsTruncatedData) {
  ExpectInvalid(Header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }\n") +
                    std::string(10, '\0'),
                "truncated: shape (2, 2) needs 16 bytes of data, the file has 10");
}

TEST(NpyTest, RejectsTruncatedHeader) {
  std::string bytes =
      Header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n");
  bytes.resize(20);
  ExpectInvalid(bytes, "truncated header");
}

TEST(NpyTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadNpy("/nonexistent.npy").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace attnserve::client
