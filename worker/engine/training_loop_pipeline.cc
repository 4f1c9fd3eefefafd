// [pp] The training loop under pipeline parallelism (docs/pipeline.md): this
// rank runs one stage's chunks by its instruction list; the loss lives on the
// last stage and the gradient norm spans every stage (and TP shard);
// checkpoints hold global tensors written stage by stage under one index.
// Kept apart from training_loop.cc, which calls in here when a pp group is
// given.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/device_staging.h"
#include "worker/engine/expert_parallel/ep_checkpoint.h"
#include "worker/engine/expert_parallel/ep_exchange.h"
#include "worker/engine/expert_parallel/ep_gradients.h"
#include "worker/engine/model/moe_stats.h"
#include "worker/engine/model/parameter_layout.h"
#include "worker/engine/tensor_parallel/tp_plan.h"
#include "worker/engine/tensor_parallel/tp_tensors.h"
#include "worker/engine/optim/lr_schedule.h"
#include "worker/engine/training_loop.h"

namespace loom::engine {

absl::Status TrainingLoop::CreatePipeline() {
  const spec::JobSpec& job = spec_;
  const spec::TrainSpec& t = job.train;
  const int pp = ctx_.pp_size();
  const int zero = static_cast<int>(job.parallelism.zero_stage.value_or(0));
  // ZeRO-3 under PP and DP was refused by spec::CheckEngineRuns in Create.
  const int64_t microbatches = t.global_batch_size / t.micro_batch_size / ctx_.data_size();  // [ep]
  absl::StatusOr<PipelinePlan> plan = MakePipelinePlan(job, ctx_.pp->rank(), pp, microbatches);
  if (!plan.ok()) return plan.status();
  ModelPart experts;
  if (ctx_.ep != nullptr && job.model.moe.enabled()) {  // [ep] this rank's experts in every chunk
    absl::StatusOr<std::unique_ptr<EpExpertExchange>> exchange =
        EpExpertExchange::Create(ctx_.ep, ops_.get(), job.model.moe.num_experts);
    if (!exchange.ok()) return exchange.status();
    experts.first_expert = (*exchange)->first_expert();
    experts.held_experts = (*exchange)->num_held();
    expert_exchange_ = std::move(*exchange);
  }
  stage_ = std::make_unique<PipelineStage>(
      job.model, job.parallelism.recompute, *plan,
      TensorParallelOptions{ctx_.tp, job.parallelism.sequence_parallel}, ops_, experts);
  for (int64_t c = 0; expert_exchange_ && c < stage_->num_chunks(); ++c) {
    stage_->model(c).SetExpertExchange(expert_exchange_.get());
  }
  stage_->InitParameters(t.seed);
  pipeline_ = std::make_unique<PipelineExecutor>(stage_.get(), ctx_.pp);
  const int64_t param_bytes = stage_->NumParameters() * static_cast<int64_t>(sizeof(float));
  if (ctx_.dp != nullptr && zero > 0) {
    // [dp] ZeRO 1/2 under PP: each chunk's optimizer states (and at stage 2
    // its reduced gradient) sharded over DP, as Megatron's distributed
    // optimizer does within each TP x PP coordinate.
    DataParallelOptions options;
    options.zero_stage = zero;
    options.bucket_bytes = job.parallelism.bucket_mb * 1024 * 1024;
    for (int64_t c = 0; c < stage_->num_chunks(); ++c) {
      absl::StatusOr<std::unique_ptr<DataParallelEngine>> engine =
          DataParallelEngine::Create(&stage_->model(c), ctx_.dp, options, t, &memory_);
      if (!engine.ok()) return engine.status();
      if (TiedAcrossStages(job.model, pp)) (*engine)->CountInNormOnce(kTiedEmbedding, 2);
      dp_engines_.push_back(std::move(*engine));
    }
  } else {
    // Moments in the backend's memory, stepped by ops->AdamW.
    optimizer_ = std::make_unique<AdamW>(stage_->Parameters(), stage_->Gradients(), t,
                                         &stage_->ops());
    memory_.Add(MemoryKind::kParameters, param_bytes);
    memory_.Add(MemoryKind::kGradients, param_bytes);
    memory_.Add(MemoryKind::kOptimizerStates, 2 * param_bytes);
  }
  flops_per_token_ =
      ModelFlopsPerToken(job.model, stage_->model(0).NumGlobalParameters(), t.seq_len);
  if (TiedAcrossStages(job.model, pp) && TiedGradient() == nullptr) {
    // A middle stage adds zeros to the first and last stages' sum.
    const TpPlan tp = MakeTpPlan(job.model, ctx_.tp_rank(), ctx_.tp_size(),
                                 job.parallelism.sequence_parallel);
    tied_count_ = tp.vocab * job.model.hidden_size;
    tied_zeros_ = ops_->AllocateFloats(tied_count_);
  }
  return absl::OkStatus();
}

float* TrainingLoop::TiedGradient() {
  for (int64_t c = 0; c < stage_->num_chunks(); ++c) {
    for (const TensorView& g : stage_->model(c).Gradients()) {
      if (g.name == kTiedEmbedding) {
        tied_count_ = g.numel();
        return g.data;
      }
    }
  }
  return nullptr;
}

absl::Status TrainingLoop::SumTiedEmbeddingGradients() {
  if (!TiedAcrossStages(spec_.model, ctx_.pp_size())) return absl::OkStatus();
  float* g = TiedGradient();
  if (g == nullptr) {  // the sum lands here too: zero it again every step
    g = tied_zeros_.f32();
    ops_->Fill(g, tied_count_, 0.0f);
  }
  return ctx_.pp->AllReduce(std::span<float>(g, static_cast<size_t>(tied_count_)));
}

absl::StatusOr<StepProgress> TrainingLoop::PipelineTrainStep() {
  const spec::TrainSpec& t = spec_.train;
  const auto start = std::chrono::steady_clock::now();
  const int64_t step = step_ + 1;
  const int64_t total_micro = t.global_batch_size / t.micro_batch_size;
  memory_.ResetPeaks();
  ops_->ResetPeakDeviceMemory();
  stage_->ZeroGradients();
  for (const auto& e : dp_engines_) e->BeginStep();
  StepProgress p;
  p.lr = LearningRate(t, step);
  float loss = 0.0f;
  PipelineStepHooks hooks;
  hooks.fill = [&](int64_t mb, Batch* out) {
    Phase("forward_backward", mb);
    FillTrainMicroBatch(step, mb, out);
  };
  hooks.reduce_gradients = [&](double loss_sum) -> absl::Status {
    Phase("reduce_gradients");
    kernels::Ops& ops = stage_->ops();
    // [tied] The embedding's gradient, first stage + last stage's copy.
    if (absl::Status s = SumTiedEmbeddingGradients(); !s.ok()) return s;
    if (!dp_engines_.empty()) {
      // [dp] ZeRO: each chunk's engine reduces (and shards) its gradient.
      for (const auto& e : dp_engines_) {
        if (absl::Status s = e->ReduceWholeGradients(); !s.ok()) return s;
      }
    } else if (ctx_.dp != nullptr) {
      // DP without ZeRO: sum each chunk's whole gradient array, in backend
      // memory.
      for (int64_t c = 0; c < stage_->num_chunks(); ++c) {
        std::vector<TensorView> g = stage_->model(c).Gradients();
        if (g.empty()) continue;
        // The views tile one contiguous array in order.
        const TensorView& last = g.back();
        const int64_t n = (last.data + last.numel()) - g.front().data;
        if (absl::Status s = ctx_.dp->AllReduce(std::span<float>(g.front().data, n)); !s.ok()) {
          return s;
        }
      }
    }
    // [ep] The dense gradients' second sum, over EP (ep_gradients.h).
    if (absl::Status s = ReduceDenseOverEp(); !s.ok()) return s;
    if (spec_.model.moe.enabled()) {  // [moe] statistics, bias update, the whole model's summary
      std::vector<LlamaModel*> chunks;
      for (int64_t c = 0; c < stage_->num_chunks(); ++c) chunks.push_back(&stage_->model(c));
      absl::StatusOr<MoeSummary> moe =
          FinishPipelineMoeStep(chunks, ctx_.DataGroups(), ctx_.pp, total_micro);
      if (!moe.ok()) return moe.status();
      p.moe = std::move(*moe);
    }
    loss = static_cast<float>(loss_sum / static_cast<double>(total_micro));
    for (comm::Communicator* group : ctx_.DataGroups()) {  // [ep] dp, then ep
      if (absl::Status s = AllReduceHostFloats(ops, group, &loss, 1); !s.ok()) return s;
    }
    // Only the last stage's is non-zero.
    if (absl::Status s = AllReduceHostFloats(ops, ctx_.pp, &loss, 1); !s.ok()) return s;
    // The whole model's norm: TP shards (replicas counted once), stages, and
    // the DP shards under ZeRO.
    absl::StatusOr<double> norm = ClipStepGradients();
    if (!norm.ok()) return norm.status();
    p.grad_norm = *norm;
    return absl::OkStatus();
  };
  hooks.optimizer_step = [&]() -> absl::Status {
    Phase("optimizer");
    absl::Status updated;
    OptimizerUpdate(p.lr, &updated);
    return updated;
  };
  if (absl::Status s = pipeline_->RunStep(1.0f / static_cast<float>(total_micro), hooks); !s.ok()) {
    return s;
  }
  if (optimizer_step() != step) {
    return absl::InternalError(absl::StrCat("pipeline stage ", ctx_.pp->rank(),
                                            ": the instruction list has no OptimizerStep"));
  }
  memory_.Set(MemoryKind::kActivations, stage_->ActivationBytes());
  return FinishStep(std::move(p), step, loss, start);
}

// ---- Checkpoints ---------------------------------------------------------------
// Files per stage S: model-tp00-ppSS.safetensors (its chunks' parameters) and
// optimizer-tp00-ppSS-dp00.safetensors (their AdamW moments), whole global
// tensors under their global names, so the index is the one a single process
// writes, split over files: any layout loads it.

absl::StatusOr<std::string> TrainingLoop::SavePipelineCheckpoint(const std::string& root,
                                                                  CheckpointContent content) {
  content.state["layout"]["pp"] = ctx_.pp->size();
  content.state["layout"]["tp"] = ctx_.tp != nullptr ? ctx_.tp->size() : 1;
  // DP rank 0's TP group of each stage gathers (the DP ranks hold the same
  // values); its TP rank 0 writes.
  kernels::Ops& ops = stage_->ops();
  absl::StatusOr<std::string> result = std::string();
  int32_t ok = 1;
  if (ctx_.dp_rank == 0) {
    std::vector<TpStaged> staged = CheckpointState(PartParameters());
    std::map<std::string, float*> values;
    std::vector<HostTensor> experts;  // [ep] every expert, gathered over EP
    for (TpStaged& t : staged) {
      if (ctx_.tp != nullptr || ctx_.ep != nullptr || !HostAddressable(ops)) {
        // Global tensors in host memory: gathered over TP in backend memory,
        // then copied down (the writer reads the host).
        if (absl::Status s = GatherGlobal(ops, t.local, ctx_.tp, &t.global); !s.ok()) return s;
        values[t.local.name] = t.global.data();
      } else {
        values[t.local.name] = t.local.data;
      }
    }
    if (ctx_.ep != nullptr) {
      std::vector<HostTensor> mine;
      for (TpStaged& t : staged) {
        if (IsExpertParameter(t.local.name)) mine.push_back({t.local.name, t.local.GlobalShape(), t.global});
      }
      absl::StatusOr<std::vector<HostTensor>> all =
          GatherExpertTensors(ops, ctx_.ep, std::move(mine), expert_exchange_->num_held());
      if (!all.ok()) return all.status();
      experts = std::move(*all);
      for (HostTensor& e : experts) values[e.name] = e.data.data();
    }
    if (ctx_.tp_rank() == 0 && ctx_.ep_rank() == 0) {
      result = WriteAndCommitPipelineStep(root, content, values);
    }
    ok = result.ok() ? 1 : 0;
    // The writer tells its TP group, those their EP group, then each of those
    // its DP group; this is also the barrier.
    if (ctx_.ep_rank() == 0) {
      if (absl::Status s = BroadcastHostInts(ops, ctx_.tp, &ok, 1, 0); !s.ok()) return s;
    }
    if (absl::Status s = BroadcastHostInts(ops, ctx_.ep, &ok, 1, 0); !s.ok()) return s;
  }
  if (absl::Status s = BroadcastHostInts(ops, ctx_.dp, &ok, 1, 0); !s.ok()) return s;
  if (!result.ok()) return result;
  if (ok != 1) {
    return absl::InternalError(absl::StrCat("the checkpoint of step ", step_, " under ", root,
                                            " was not committed (a pipeline stage's writer failed)"));
  }
  return result;
}

namespace {

constexpr int kFilesPerStage = 2;

std::string StageFileName(bool optimizer, int64_t stage) {
  return optimizer ? absl::StrFormat("optimizer-tp00-pp%02d-dp00.safetensors", stage)
                   : absl::StrFormat("model-tp00-pp%02d.safetensors", stage);
}

// Stage `stage`'s two files, described from the spec alone (names and global
// shapes, no data): the committing stage lists every stage's tensors in the
// index without receiving them.
absl::StatusOr<std::vector<CheckpointFile>> DescribeStageFiles(const spec::JobSpec& spec,
                                                               int64_t stage, int64_t pp,
                                                               int64_t microbatches) {
  absl::StatusOr<PipelinePlan> plan = MakePipelinePlan(spec, stage, pp, microbatches);
  if (!plan.ok()) return plan.status();
  const TpPlan whole = MakeTpPlan(spec.model, 0, 1, false);
  CheckpointFile model{StageFileName(false, stage), "model", {}, {}};
  CheckpointFile optimizer{StageFileName(true, stage), "optimizer", {}, {}};
  std::vector<TensorView> exp_avg_sq;
  for (const PipelineChunk& c : plan->chunks) {
    const ModelPart part{c.first_layer, c.num_layers, c.embedding, c.head};
    for (const ParameterEntry& e : MakeParameterLayout(spec.model, whole, part).entries) {
      // A tied head's copy of the embedding: the first stage writes it.
      if (!c.embedding && e.name == kTiedEmbedding) continue;
      model.tensors.push_back({e.name, e.shape, nullptr});
      optimizer.tensors.push_back({"optimizer.exp_avg." + e.name, e.shape, nullptr});
      exp_avg_sq.push_back({"optimizer.exp_avg_sq." + e.name, e.shape, nullptr});
    }
  }
  for (TensorView& v : exp_avg_sq) optimizer.tensors.push_back(std::move(v));
  std::vector<CheckpointFile> files;
  files.push_back(std::move(model));
  files.push_back(std::move(optimizer));
  return files;
}

}  // namespace

// Collective over the pp group of DP rank 0 / TP rank 0 (the stage writers):
// stage 0 opens the temporary directory, every stage writes its files, the
// digests travel to stage 0, which commits when all arrived and tells the
// others. Returns the step directory on stage 0, "" on the others.
absl::StatusOr<std::string> TrainingLoop::WriteAndCommitPipelineStep(
    const std::string& root, const CheckpointContent& content,
    const std::map<std::string, float*>& values) {
  const int pp = ctx_.pp->size();
  const int stage = ctx_.pp->rank();
  const spec::TrainSpec& t = spec_.train;
  const int64_t microbatches = t.global_batch_size / t.micro_batch_size / ctx_.data_size();
  absl::StatusOr<std::string> begun = std::string();
  int32_t header[2] = {0, 0};  // started, pid
  if (stage == 0) {
    begun = BeginCheckpointStep(root, content.step, ::getpid());
    header[0] = begun.ok() ? 1 : 0;
    header[1] = static_cast<int32_t>(::getpid());
  }
  kernels::Ops& ops = stage_->ops();
  if (absl::Status s = BroadcastHostInts(ops, ctx_.pp, header, 2, 0); !s.ok()) return s;
  if (header[0] != 1) {
    if (stage == 0) return begun.status();
    return absl::InternalError(absl::StrCat("pipeline stage 0 could not start the checkpoint of step ",
                                            content.step, " under ", root));
  }
  const std::string tmp = CheckpointTempDir(root, content.step, static_cast<int64_t>(header[1]));

  std::vector<int32_t> mine_digests(static_cast<size_t>(kFilesPerStage * kDigestInts), 0);
  absl::Status write_status;
  absl::StatusOr<std::vector<CheckpointFile>> mine = DescribeStageFiles(spec_, stage, pp, microbatches);
  if (!mine.ok()) write_status = mine.status();
  for (size_t i = 0; write_status.ok() && i < mine->size(); ++i) {
    CheckpointFile& file = (*mine)[i];
    for (TensorView& v : file.tensors) {
      auto it = values.find(v.name);
      if (it == values.end()) {
        write_status = absl::InternalError(absl::StrCat(
            "pipeline stage ", stage, " holds no tensor ", v.name, " for ", file.name));
        break;
      }
      v.data = it->second;
    }
    if (!write_status.ok()) break;
    absl::StatusOr<FileDigest> d = WriteCheckpointFile(tmp, file);
    if (!d.ok()) {
      write_status = d.status();
      break;
    }
    EncodeFileDigest(*d, &mine_digests[i * kDigestInts]);
  }
  std::vector<int32_t> digests(static_cast<size_t>(pp) * mine_digests.size(), 0);
  if (absl::Status s = AllGatherHostInts(ops, ctx_.pp, mine_digests.data(),
                                         static_cast<int64_t>(mine_digests.size()), digests.data());
      !s.ok()) {
    return s;
  }

  absl::StatusOr<std::string> committed = std::string();
  int32_t ok = 0;
  if (stage == 0) {
    CheckpointContent all = content;
    all.files.clear();
    std::vector<FileDigest> file_digests;
    std::vector<std::string> missing;
    for (int s = 0; s < pp && committed.ok(); ++s) {
      absl::StatusOr<std::vector<CheckpointFile>> files = DescribeStageFiles(spec_, s, pp, microbatches);
      if (!files.ok()) {
        committed = files.status();
        break;
      }
      for (size_t i = 0; i < files->size(); ++i) {
        const int32_t* slot = &digests[(s * kFilesPerStage + i) * kDigestInts];
        if (slot[0] != 1) missing.push_back((*files)[i].name);
        file_digests.push_back(DecodeFileDigest(slot));
        all.files.push_back(std::move((*files)[i]));
      }
    }
    if (committed.ok() && !missing.empty()) {
      committed = absl::InternalError(absl::StrCat(
          "checkpoint of step ", content.step, ": not every pipeline stage wrote its files (",
          absl::StrJoin(missing, ", "), ")",
          write_status.ok() ? "" : ": " + write_status.ToString()));
    } else if (committed.ok()) {
      committed = CommitCheckpointStep(root, tmp, all, file_digests, spec_.checkpoint.keep);
    }
    ok = committed.ok() ? 1 : 0;
  }
  if (absl::Status s = BroadcastHostInts(ops, ctx_.pp, &ok, 1, 0); !s.ok()) return s;
  if (stage == 0) return committed;
  if (!write_status.ok()) return write_status;
  if (ok != 1) {
    return absl::InternalError(absl::StrCat("pipeline stage 0 failed to commit the checkpoint of step ",
                                            content.step, " under ", root));
  }
  return std::string();
}

}  // namespace loom::engine
