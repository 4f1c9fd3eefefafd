// loomctl export: a checkpoint to the Hugging Face Llama layout, here
// (no coordinator).
#include <cstdio>

#include "absl/flags/flag.h"
#include "client/loomctl_context.h"
#include "client/loomctl_verbs.h"
#include "common/cli/parse_flags.h"
#include "export/hf_export.h"

namespace loom::client {

int RunExport(const Args& args) {
  if (absl::GetFlag(FLAGS_format) != "hf") loom::cli::UsageError("export needs --format=hf");
  absl::Status status = loom::hf_export::ExportHuggingFace(args[1], args[2]);
  if (!status.ok()) return Fail(std::string(status.message()));
  std::printf("exported %s to %s (config.json, model.safetensors)\n", args[1].c_str(),
              args[2].c_str());
  return 0;
}

}  // namespace loom::client
