// Our safetensors writer against the format as specified (checked with an
// independent JSON parse of the raw bytes), the reader's round trip, and its
// refusals.
#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/test_util.h"
#include "worker/engine/checkpoint/crc32.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace loom::engine {
namespace {

using ::testing::HasSubstr;
using testing::ReadFile;
using testing::ScratchDir;
using testing::WriteFile;

TEST(Crc32Test, KnownVectors) {
  EXPECT_EQ(Crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(Crc32(0, "", 0), 0u);
  const std::string s = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(Crc32(0, s.data(), s.size()), 0x414FA339u);
  // Incremental in uneven pieces.
  EXPECT_EQ(Crc32(Crc32(0, s.data(), 13), s.data() + 13, s.size() - 13), 0x414FA339u);
}

struct Fixture {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<float> b = {-0.5f};
  std::vector<TensorView> views() { return {{"zeta.weight", {2, 3}, a.data()}, {"alpha", {1}, b.data()}}; }
};

TEST(SafetensorsTest, LayoutFollowsTheFormat) {
  ScratchDir dir;
  Fixture f;
  auto digest = WriteSafetensors(dir / "x.safetensors", f.views(), {{"format", "pt"}});
  ASSERT_TRUE(digest.ok()) << digest.status();
  const std::string raw = ReadFile(dir / "x.safetensors");
  EXPECT_EQ(digest->bytes, static_cast<int64_t>(raw.size()));
  EXPECT_EQ(digest->crc32, Crc32(0, raw.data(), raw.size()));
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);  // little-endian host
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(raw.size(), 8 + n + 7 * 4);
  auto header = nlohmann::json::parse(raw.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["zeta.weight"]["dtype"], "F32");
  EXPECT_EQ(header["zeta.weight"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["zeta.weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["alpha"]["data_offsets"], nlohmann::json({24, 28}));
  float third;
  std::memcpy(&third, raw.data() + 8 + n + 8, 4);
  EXPECT_EQ(third, 3.0f);
}

TEST(SafetensorsTest, RoundTrip) {
  ScratchDir dir;
  Fixture f;
  ASSERT_TRUE(WriteSafetensors(dir / "x.safetensors", f.views(), {{"k", "v"}}).ok());
  auto file = SafetensorsFile::Read(dir / "x.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("k"), "v");
  ASSERT_EQ(file->entries().size(), 2u);
  EXPECT_EQ(file->entries()[0].name, "zeta.weight");  // data order
  std::vector<float> out(6);
  ASSERT_TRUE(file->CopyTo("zeta.weight", {"zeta.weight", {2, 3}, out.data()}).ok());
  EXPECT_EQ(out, f.a);
  EXPECT_EQ(file->Values(*file->Find("alpha")), f.b);
  auto wrong = file->CopyTo("zeta.weight", {"zeta.weight", {3, 2}, out.data()});
  EXPECT_THAT(wrong.message(), HasSubstr("shape [2, 3]"));
}

TEST(SafetensorsTest, Refusals) {
  ScratchDir dir;
  Fixture f;
  ASSERT_TRUE(WriteSafetensors(dir / "x.safetensors", f.views(), {}).ok());
  const std::string good = ReadFile(dir / "x.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);

  auto refuse = [&](const std::string& bytes, const std::string& fault) {
    auto r = SafetensorsFile::Parse(bytes, "p.safetensors");
    ASSERT_FALSE(r.ok()) << fault;
    EXPECT_THAT(r.status().message(), HasSubstr(fault));
    EXPECT_THAT(r.status().message(), HasSubstr("p.safetensors"));
  };
  refuse(good.substr(0, 5), "truncated");
  refuse(good.substr(0, good.size() - 3), "truncated: tensor alpha");
  refuse(good + "xxxx", "size mismatch");
  std::string huge = good;
  huge[6] = 1;  // header length of 2^48
  refuse(huge, "corrupt header: header length");
  std::string not_json = good;
  not_json[8] = '[';
  refuse(not_json, "corrupt header");
  std::string f16 = good;
  const size_t pos = f16.find("\"F32\"");
  f16.replace(pos, 5, "\"F16\"");
  refuse(f16, "dtype F16");
}

}  // namespace
}  // namespace loom::engine
