// loomctl: the user's client. Each verb is one entry of the table below
// (client/verb_table.h): its help, argument check and dispatch come from it.
// Adding a verb: write `int RunXxx(const Args&)` in its own file under
// client/, declare it in loomctl_verbs.h (or a header of its own), add the
// file to client/CMakeLists.txt and one entry here (docs/client.md).
#include <cstdio>
#include <vector>

#include "client/loomctl_verbs.h"
#include "client/verb_table.h"
#include "common/cli/parse_flags.h"

namespace {

using loom::client::Verb;

constexpr char kUsage[] =
    "loomctl [global flags] VERB [arguments] [flags] (`loomctl help` lists the verbs)";

const std::vector<Verb>& Verbs() {
  using namespace loom::client;
  static const std::vector<Verb> verbs = {
      // name, arguments, summary, its flags, example, function[, min, max arguments]
      {"submit", "JOB.yaml", "submit a job; prints its ID (--watch: then follow it to the end)",
       {"watch", "format", "reconnect_s"}, "loomctl submit examples/tiny-llama.yaml --watch", RunSubmit},
      {"plan", "JOB.yaml", "the layout the planner would choose, with its estimates",
       {"offline", "format", "candidates", "profile", "sweep", "svg", "gpu"},
       "loomctl plan examples/tiny-llama.yaml --offline --format=json", RunPlan, 0, 1},
      {"list", "", "every job you may see: ID, name, owner, state, step, loss", {"format"},
       "loomctl list --format=json", RunList},
      {"status", "ID", "one job: state, plan, where each rank runs, history", {"format"},
       "loomctl status j-0001", RunStatus},
      {"watch", "ID", "follow a job's steps and events until it ends (exit 0 only if it succeeded)",
       {"format", "reconnect_s"}, "loomctl watch j-0001 --format=jsonl", RunWatch},
      {"logs", "ID", "a rank's log lines, from its node (owner or admin; works after the job ended)",
       {"rank", "all", "follow", "tail", "attempt"}, "loomctl logs j-0001 --rank=1 --follow --tail=20",
       RunLogs},
      {"trace", "ID",
       "record one step on every rank and write a Chrome trace-event JSON (owner or admin)",
       {"step", "output", "ranks", "wait_s"},
       "loomctl trace j-0001 --output=step.json --ranks=0,2-3", RunTrace},
      {"cancel", "ID", "stop a job (its ranks get SIGTERM, then SIGKILL)", {},
       "loomctl cancel j-0001", RunCancel},
      {"delete", "ID", "forget a finished job", {}, "loomctl delete j-0001", RunDelete},
      {"nodes", "", "the nodes, their devices and what runs on them", {}, "loomctl nodes", RunNodes},
      {"queue", "", "the waiting jobs in queue order, with why each waits (yours, at their place)",
       {}, "loomctl queue", RunQueue},
      {"quota", "set|get|list",
       "devices a user or group may hold at once, and a user's priority cap (admin)",
       {"user", "group", "gpu_quota", "cpu_quota", "max_priority"},
       "loomctl quota set --user=alice --gpu_quota=8 --max_priority=5", RunQuota},
      {"drain", "NODE",
       "take a node out of service without losing a step: its jobs save their next step and "
       "resume elsewhere (admin)",
       {"reason"}, "loomctl drain node-a --reason='memory errors'", RunDrain},
      {"uncordon", "NODE", "let the scheduler place ranks on a cordoned (or drained) node again", {},
       "loomctl uncordon node-a", RunUncordon},
      {"export", "CHECKPOINT_DIR OUT_DIR",
       "write a checkpoint in the Hugging Face Llama layout (runs here)", {"format"},
       "loomctl export --format=hf ckpt/step-50 hf-out", RunExport},
      {"whoami", "", "the identity the coordinator sees for you, and its role", {},
       "loomctl whoami", RunWhoAmI},
      {"token", "create|revoke", "create a bearer token for a user, or revoke all of theirs (admin)",
       {"user"}, "loomctl token create --user=alice > alice.token", RunToken},
  };
  return verbs;
}

int Help(const std::vector<std::string>& topic) {
  if (topic.empty()) {
    std::printf("%s", loom::client::RenderHelp(Verbs()).c_str());
    return 0;
  }
  const Verb* verb = loom::client::FindVerb(Verbs(), topic[0]);
  if (verb == nullptr) loom::cli::UsageError(loom::client::UnknownVerbMessage(Verbs(), topic[0]));
  std::printf("%s", loom::client::RenderVerbHelp(*verb).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const loom::cli::CommandLine command_line = loom::cli::ParseCommandLine(argc, argv, kUsage);
  const std::vector<std::string>& args = command_line.positional;
  if (command_line.help) return Help(args.empty() ? args : std::vector{args[0]});
  if (args.empty()) {
    std::fprintf(stderr, "%s", loom::client::RenderHelp(Verbs()).c_str());
    return 2;
  }
  if (args[0] == "help") return Help({args.begin() + 1, args.end()});
  const Verb* verb = loom::client::FindVerb(Verbs(), args[0]);
  if (verb == nullptr) loom::cli::UsageError(loom::client::UnknownVerbMessage(Verbs(), args[0]));
  if (std::string error = loom::client::CheckArgumentCount(*verb, args); !error.empty()) {
    loom::cli::UsageError(error + "; `loomctl help " + verb->name + "` shows how");
  }
  if (std::string error = loom::client::CheckFlags(*verb, command_line.flags_set); !error.empty()) {
    loom::cli::UsageError(error);
  }
  return verb->run(args);
}
