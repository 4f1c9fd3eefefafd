// Export to the Hugging Face layout from a checkpoint built by hand: names,
// shapes, values, config.json, tied embeddings, and refusal of a damaged
// checkpoint.
#include <filesystem>
#include <map>

#include "export/hf_export.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/one_writer_checkpoint.h"
#include "tests/engine/test_util.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace loom::engine {
namespace {

using ::testing::HasSubstr;
using hf_export::ExportHuggingFace;
using hf_export::HuggingFaceParameterNames;
using testing::CommitCheckpoint;
using testing::ReadFile;
using testing::ScratchDir;
using testing::WriteFile;

spec::ModelSpec SmallModel(bool tied) {
  spec::ModelSpec m;
  m.vocab_size = 50;
  m.hidden_size = 8;
  m.num_layers = 2;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.ffn_hidden_size = 12;
  m.max_seq_len = 64;
  m.rope_theta = 500000;
  m.norm_eps = 1e-6;
  m.tie_embeddings = tied;
  return m;
}

// HF shapes written out from the Llama definition, independently of export.
std::map<std::string, std::vector<int64_t>> ExpectedShapes(const spec::ModelSpec& m) {
  const int64_t h = m.hidden_size, hd = h / m.num_heads, kv = m.num_kv_heads * hd;
  std::map<std::string, std::vector<int64_t>> s = {{"model.embed_tokens.weight", {m.vocab_size, h}},
                                                   {"model.norm.weight", {h}}};
  for (int i = 0; i < m.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    s[p + "input_layernorm.weight"] = {h};
    s[p + "post_attention_layernorm.weight"] = {h};
    s[p + "self_attn.q_proj.weight"] = {h, h};
    s[p + "self_attn.k_proj.weight"] = {kv, h};
    s[p + "self_attn.v_proj.weight"] = {kv, h};
    s[p + "self_attn.o_proj.weight"] = {h, h};
    s[p + "mlp.gate_proj.weight"] = {m.ffn_hidden_size, h};
    s[p + "mlp.up_proj.weight"] = {m.ffn_hidden_size, h};
    s[p + "mlp.down_proj.weight"] = {h, m.ffn_hidden_size};
  }
  if (!m.tie_embeddings) s["lm_head.weight"] = {m.vocab_size, h};
  return s;
}

struct FakeCheckpoint {
  std::vector<std::vector<float>> storage;
  CheckpointContent content;
  explicit FakeCheckpoint(const spec::ModelSpec& m) {
    const auto shapes = ExpectedShapes(m);
    storage.reserve(2 * shapes.size());
    std::vector<TensorView> params, moments;
    float v = 0;
    for (const auto& [name, shape] : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      storage.emplace_back(static_cast<size_t>(n));
      for (float& x : storage.back()) x = (v += 0.25f);
      params.push_back({name, shape, storage.back().data()});
      storage.emplace_back(static_cast<size_t>(n), 1.0f);
      moments.push_back({"optimizer.exp_avg." + name, shape, storage.back().data()});
    }
    content.step = 7;
    content.model = m;
    content.files = {{"model-tp00-pp00.safetensors", "model", params},
                     {"optimizer-tp00-pp00-dp00.safetensors", "optimizer", moments}};
  }
};

void CheckExport(bool tied) {
  ScratchDir dir;
  const spec::ModelSpec m = SmallModel(tied);
  FakeCheckpoint ckpt(m);
  ASSERT_TRUE(CommitCheckpoint(dir / "ckpt", ckpt.content, 2).ok());
  // The root resolves to its newest step.
  absl::Status s = ExportHuggingFace(dir / "ckpt", dir / "hf");
  ASSERT_TRUE(s.ok()) << s;

  auto config = nlohmann::json::parse(ReadFile(dir / "hf/config.json"));
  EXPECT_EQ(config["architectures"], nlohmann::json({"LlamaForCausalLM"}));
  EXPECT_EQ(config["hidden_size"], 8);
  EXPECT_EQ(config["intermediate_size"], 12);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["vocab_size"], 50);
  EXPECT_EQ(config["max_position_embeddings"], 64);
  EXPECT_EQ(config["rope_theta"], 500000.0);
  EXPECT_EQ(config["rms_norm_eps"], 1e-6);
  EXPECT_EQ(config["tie_word_embeddings"], tied);
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["hidden_act"], "silu");

  auto file = SafetensorsFile::Read(dir / "hf/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  const auto shapes = ExpectedShapes(m);
  ASSERT_EQ(file->entries().size(), shapes.size());  // no optimizer state
  for (const auto& e : file->entries()) {
    ASSERT_TRUE(shapes.count(e.name)) << e.name;
    EXPECT_EQ(e.shape, shapes.at(e.name)) << e.name;
  }
  EXPECT_EQ(file->Find("lm_head.weight") != nullptr, !tied);
  // Values come through unchanged.
  for (size_t i = 0; i < ckpt.content.files[0].tensors.size(); ++i) {
    const TensorView& t = ckpt.content.files[0].tensors[i];
    std::vector<float> want(t.data, t.data + t.numel());
    EXPECT_EQ(file->Values(*file->Find(t.name)), want) << t.name;
  }
}

TEST(ExportTest, UntiedLayout) { CheckExport(false); }
TEST(ExportTest, TiedLayout) { CheckExport(true); }

TEST(ExportTest, NamesInModelOrder) {
  auto names = HuggingFaceParameterNames(SmallModel(false));
  ASSERT_EQ(names.size(), 1 + 2 * 9 + 2u);
  EXPECT_EQ(names[0], "model.embed_tokens.weight");
  EXPECT_EQ(names[1], "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(names[2], "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(names[9], "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
}

TEST(ExportTest, RefusesDamagedOrMissingCheckpoint) {
  ScratchDir dir;
  FakeCheckpoint ckpt(SmallModel(false));
  ASSERT_TRUE(CommitCheckpoint(dir / "ckpt", ckpt.content, 2).ok());
  const std::string shard = dir / "ckpt/step_00000007/model-tp00-pp00.safetensors";
  std::string bytes = ReadFile(shard);
  bytes[bytes.size() - 1] ^= 1;
  WriteFile(shard, bytes);
  absl::Status s = ExportHuggingFace(dir / "ckpt/step_00000007", dir / "hf");
  EXPECT_THAT(s.message(), HasSubstr("model-tp00-pp00.safetensors: checksum mismatch"));
  absl::Status none = ExportHuggingFace(dir / "nothing", dir / "hf");
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace loom::engine
