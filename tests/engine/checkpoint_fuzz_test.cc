// Crafted and corrupted checkpoints against the reader and export: every
// field of metadata.json, index.json and the safetensors headers is input,
// and a bad one must be an error naming it, never a crash (SIGFPE on zero
// heads, bad_alloc on an overflowing shape, reads past the end of a file),
// with nothing written to the export directory. The metadata's sizes and
// CRCs are rewritten after each change, so the checks behind them are the
// ones exercised.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>

#include "absl/strings/str_format.h"
#include "export/hf_export.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/one_writer_checkpoint.h"
#include "tests/engine/test_util.h"
#include "worker/engine/checkpoint/checkpoint_checks.h"
#include "worker/engine/checkpoint/checkpoint_loader.h"
#include "worker/engine/checkpoint/checkpoint_reader.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/checkpoint/crc32.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using nlohmann::json;
using hf_export::ExportHuggingFace;
using testing::CommitCheckpoint;
using testing::ReadFile;
using testing::ScratchDir;
using testing::WriteFile;

constexpr char kModelFile[] = "model-tp00-pp00.safetensors";

spec::ModelSpec TinyModel() {
  spec::ModelSpec m;
  m.vocab_size = 16;
  m.hidden_size = 4;
  m.num_layers = 1;
  m.num_heads = 2;
  m.num_kv_heads = 1;
  m.ffn_hidden_size = 6;
  m.max_seq_len = 8;
  m.rope_theta = 10000;
  m.norm_eps = 1e-5;
  m.tie_embeddings = false;
  return m;
}

// The HF parameters of TinyModel, in one model file.
struct Tiny {
  std::vector<std::vector<float>> storage;
  CheckpointContent content;
  Tiny() {
    const spec::ModelSpec m = TinyModel();
    const int64_t h = m.hidden_size, kv = m.num_kv_heads * (h / m.num_heads);
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
        {"model.embed_tokens.weight", {m.vocab_size, h}}, {"model.norm.weight", {h}},
        {"lm_head.weight", {m.vocab_size, h}}};
    const std::string p = "model.layers.0.";
    for (const auto& [suffix, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"input_layernorm.weight", {h}}, {"self_attn.q_proj.weight", {h, h}},
             {"self_attn.k_proj.weight", {kv, h}}, {"self_attn.v_proj.weight", {kv, h}},
             {"self_attn.o_proj.weight", {h, h}}, {"post_attention_layernorm.weight", {h}},
             {"mlp.gate_proj.weight", {m.ffn_hidden_size, h}},
             {"mlp.up_proj.weight", {m.ffn_hidden_size, h}},
             {"mlp.down_proj.weight", {h, m.ffn_hidden_size}}}) {
      shapes.push_back({p + suffix, shape});
    }
    storage.reserve(shapes.size());
    std::vector<TensorView> params;
    for (const auto& [name, shape] : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      storage.emplace_back(static_cast<size_t>(n), 0.5f);
      params.push_back({name, shape, storage.back().data()});
    }
    content.step = 3;
    content.model = m;
    content.files = {{kModelFile, "model", params}};
  }
};

class CheckpointFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Tiny tiny;
    ASSERT_TRUE(CommitCheckpoint(dir_ / "ckpt", tiny.content, 2).ok());
    step_ = dir_ / "ckpt/step_00000003";
    pristine_model_ = ReadFile(step_ + "/" + kModelFile);
    pristine_index_ = ReadFile(step_ + "/index.json");
    pristine_meta_ = ReadFile(step_ + "/metadata.json");
  }

  // Replaces a listed file and records its new size and CRC in metadata.json.
  void Rewrite(const std::string& name, const std::string& bytes) {
    WriteFile(step_ + "/" + name, bytes);
    json meta = json::parse(ReadFile(step_ + "/metadata.json"));
    meta["files"][name]["bytes"] = bytes.size();
    meta["files"][name]["crc32"] = absl::StrFormat("%08x", Crc32(0, bytes.data(), bytes.size()));
    WriteFile(step_ + "/metadata.json", meta.dump());
  }
  void EditMeta(const std::function<void(json&)>& edit) {
    json meta = json::parse(ReadFile(step_ + "/metadata.json"));
    edit(meta);
    WriteFile(step_ + "/metadata.json", meta.dump());
  }
  void Restore() {
    WriteFile(step_ + "/" + kModelFile, pristine_model_);
    WriteFile(step_ + "/index.json", pristine_index_);
    WriteFile(step_ + "/metadata.json", pristine_meta_);
  }
  // A safetensors file whose header is `header` followed by `data_bytes` bytes.
  static std::string Safetensors(const json& header, size_t data_bytes) {
    std::string text = header.dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
    return out + text + std::string(data_bytes, '\0');
  }
  // Export must fail naming `fault`, leaving no out directory and no temporary.
  void ExpectExportRefused(const std::string& fault) {
    absl::Status s = ExportHuggingFace(step_, dir_ / "hf");
    ASSERT_FALSE(s.ok()) << fault;
    EXPECT_THAT(s.message(), HasSubstr(fault));
    EXPECT_FALSE(fs::exists(dir_ / "hf")) << fault;
    for (const auto& e : fs::directory_iterator(dir_.path())) {
      EXPECT_EQ(e.path().filename().string().find(".export-"), std::string::npos) << e.path();
    }
  }

  ScratchDir dir_;
  std::string step_, pristine_model_, pristine_index_, pristine_meta_;
};

TEST_F(CheckpointFuzzTest, PristineExports) {
  ASSERT_TRUE(ExportHuggingFace(step_, dir_ / "hf").ok());
  EXPECT_TRUE(fs::exists(dir_ / "hf/config.json"));
  EXPECT_TRUE(fs::exists(dir_ / "hf/model.safetensors"));
}

TEST_F(CheckpointFuzzTest, ZeroHeadsIsAnErrorNotSigfpe) {
  EditMeta([](json& m) { m["model"]["num_heads"] = 0; });
  ExpectExportRefused("model.num_heads=0 must be positive");
  absl::StatusOr<CheckpointReader> r = CheckpointReader::Open(step_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);  // exit 3 on resume
}

TEST_F(CheckpointFuzzTest, ModelFieldsThatBreakTheSpecRules) {
  const std::pair<const char*, json> cases[] = {{"num_kv_heads", -1},  {"hidden_size", 0},
                                                {"num_kv_heads", 3},   {"hidden_size", -4},
                                                {"vocab_size", 1},     {"num_layers", 0}};
  for (const auto& [field, value] : cases) {
    Restore();
    EditMeta([&](json& m) { m["model"][field] = value; });
    ExpectExportRefused(absl::StrCat("model.", field));
  }
}

TEST_F(CheckpointFuzzTest, HugeLayerCountIsBoundedByTheTensorsHeld) {
  EditMeta([](json& m) { m["model"]["num_layers"] = 1000000000; });
  ExpectExportRefused("model.num_layers=1000000000");
}

TEST_F(CheckpointFuzzTest, OverflowingShapeInIndexIsAnErrorNotBadAlloc) {
  for (const json& shape : {json{int64_t{1} << 62, 4}, json{int64_t{1} << 31, int64_t{1} << 31},
                            json{-16, 4}, json{int64_t{1} << 40, 2}}) {
    Restore();
    json index = json::parse(pristine_index_);
    index["tensors"]["model.embed_tokens.weight"]["shape"] = shape;
    Rewrite("index.json", index.dump());
    absl::StatusOr<CheckpointReader> r = CheckpointReader::Open(step_);
    ASSERT_FALSE(r.ok()) << shape;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("model.embed_tokens.weight"));
  }
}

TEST_F(CheckpointFuzzTest, ShardOffsetsThatOverflowAreRefused) {
  json index = json::parse(pristine_index_);
  json& shard = index["tensors"]["model.norm.weight"]["shards"][0];
  shard["offset"] = json{INT64_MAX};
  Rewrite("index.json", index.dump());
  absl::StatusOr<CheckpointReader> r = CheckpointReader::Open(step_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("lies outside"));
}

TEST_F(CheckpointFuzzTest, SafetensorsHeadersThatLie) {
  struct Case {
    std::string bytes;
    std::string fault;
  };
  const json huge = {{"x", {{"dtype", "F32"},
                            {"shape", {uint64_t{1} << 40, uint64_t{1} << 40}},
                            {"data_offsets", {0, 0}}}}};
  const json past_eof = {
      {"x", {{"dtype", "F32"}, {"shape", {1024, 1024}}, {"data_offsets", {0, 4194304}}}}};
  const json wrapped = {{"x",
                         {{"dtype", "F32"},
                          {"shape", {1}},
                          {"data_offsets", {uint64_t{1} << 63, (uint64_t{1} << 63) + 4}}}}};
  std::string bad_len = pristine_model_;
  bad_len[7] = '\x7f';  // header length far past the end
  const Case cases[] = {
      {pristine_model_.substr(0, 5), "truncated"},
      {pristine_model_.substr(0, pristine_model_.size() - 4), "truncated"},
      {Safetensors(huge, 0), "more than 2^40 elements"},
      {Safetensors(past_eof, 16), "truncated"},
      {Safetensors(wrapped, 4), "data_offsets"},
      {bad_len, "header length"},
  };
  for (const Case& c : cases) {
    Restore();
    Rewrite(kModelFile, c.bytes);
    absl::StatusOr<CheckpointReader> r = CheckpointReader::Open(step_);
    ASSERT_FALSE(r.ok()) << c.fault;
    EXPECT_THAT(r.status().message(), HasSubstr(c.fault));
    EXPECT_THAT(r.status().message(), HasSubstr(kModelFile));
    // Opening on demand reads only the header, and refuses it the same way.
    r = CheckpointReader::Open(step_, CheckpointReadMode::kOnDemand);
    ASSERT_FALSE(r.ok()) << c.fault;
    EXPECT_THAT(r.status().message(), HasSubstr(c.fault));
    EXPECT_THAT(r.status().message(), HasSubstr(kModelFile));
  }
}

TEST_F(CheckpointFuzzTest, ResumeFromACraftedCheckpointIsRefusedNotFatal) {
  EditMeta([](json& m) { m["model"]["num_heads"] = 0; });
  Tiny tiny;
  std::vector<TensorView> into = tiny.content.files[0].tensors;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir_ / "ckpt", TinyModel(), into);
  ASSERT_FALSE(loaded.ok());
  // FAILED_PRECONDITION: the trainer exits with code 3 (job broken).
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.status().message(), HasSubstr("model.num_heads=0"));
}

// Random single-byte damage to the headers and the index, metadata kept in
// step: every outcome is a status (the test would crash otherwise).
TEST_F(CheckpointFuzzTest, RandomDamageNeverCrashes) {
  std::mt19937 rng(20240601);
  const size_t header_end = 8 + static_cast<size_t>(static_cast<unsigned char>(pristine_model_[0])) +
                            (static_cast<size_t>(static_cast<unsigned char>(pristine_model_[1])) << 8);
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    Restore();
    const bool index = i % 2 == 0;
    std::string bytes = index ? pristine_index_ : pristine_model_;
    const size_t limit = index ? bytes.size() : std::min(header_end, bytes.size());
    for (int k = 0; k < 3; ++k) {
      bytes[rng() % limit] = "0123456789-[]{}\",:e9\xff"[rng() % 21];
    }
    Rewrite(index ? "index.json" : kModelFile, bytes);
    // On demand too: headers at open, data at the copy.
    absl::StatusOr<CheckpointReader> lazy =
        CheckpointReader::Open(step_, CheckpointReadMode::kOnDemand);
    if (lazy.ok()) {
      for (const CheckpointTensorInfo& t : lazy->tensors()) {
        absl::StatusOr<std::vector<float>> v = lazy->Values(t.name);
        (void)v;
      }
    }
    absl::StatusOr<CheckpointReader> r = CheckpointReader::Open(step_);
    EXPECT_EQ(lazy.ok(), r.ok()) << (r.ok() ? lazy.status() : r.status());
    if (!r.ok()) {
      ++refused;
      continue;
    }
    for (const CheckpointTensorInfo& t : r->tensors()) {
      absl::StatusOr<std::vector<float>> v = r->Values(t.name);
      (void)v;
    }
  }
  EXPECT_GT(refused, 100);  // most damage is caught
}

TEST_F(CheckpointFuzzTest, ExportReplacesFilesWithoutFollowingSymlinks) {
  fs::create_directories(dir_ / "hf");
  WriteFile(dir_ / "victim.txt", "keep me");
  fs::create_symlink(dir_ / "victim.txt", dir_ / "hf/config.json");
  WriteFile(dir_ / "hf/README.md", "other file");
  ASSERT_TRUE(ExportHuggingFace(step_, dir_ / "hf").ok());
  EXPECT_EQ(ReadFile(dir_ / "victim.txt"), "keep me");
  EXPECT_FALSE(fs::is_symlink(dir_ / "hf/config.json"));
  EXPECT_EQ(ReadFile(dir_ / "hf/README.md"), "other file");
  // A refused export leaves what is there untouched.
  const std::string before = ReadFile(dir_ / "hf/model.safetensors");
  EditMeta([](json& m) { m["model"]["num_heads"] = 0; });
  EXPECT_FALSE(ExportHuggingFace(step_, dir_ / "hf").ok());
  EXPECT_EQ(ReadFile(dir_ / "hf/model.safetensors"), before);
}

TEST(CheckedElementCountTest, Bounds) {
  EXPECT_EQ(*CheckedElementCount({2, 3, 4}, "t"), 24);
  EXPECT_EQ(*CheckedElementCount({}, "t"), 1);
  EXPECT_EQ(*CheckedElementCount({0, int64_t{1} << 62}, "t"), 0);
  EXPECT_FALSE(CheckedElementCount({int64_t{1} << 21, int64_t{1} << 20}, "t").ok());
  EXPECT_FALSE(CheckedElementCount({-1}, "t").ok());
  EXPECT_TRUE(FitsWithin(2, 3, 5));
  EXPECT_FALSE(FitsWithin(INT64_MAX, 1, 5));
  EXPECT_FALSE(FitsWithin(-1, 1, 5));
}

}  // namespace
}  // namespace loom::engine
