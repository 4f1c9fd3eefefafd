// The functions behind loomctl's verbs, one per verb (args[0] is the verb);
// the table in client/loomctl_main.cc names them.
#pragma once

#include <string>
#include <vector>

namespace loom::client {

using Args = std::vector<std::string>;

int RunSubmit(const Args& args);    // job_verbs.cc
int RunList(const Args& args);
int RunStatus(const Args& args);
int RunWatch(const Args& args);
int RunCancel(const Args& args);
int RunDelete(const Args& args);
int RunPlan(const Args& args);      // plan_verb.cc
int RunNodes(const Args& args);     // cluster_verbs.cc
int RunUncordon(const Args& args);
int RunDrain(const Args& args);
int RunWhoAmI(const Args& args);    // auth_verbs.cc
int RunToken(const Args& args);
int RunExport(const Args& args);    // export_verb.cc
int RunLogs(const Args& args);      // logs_verb.cc
int RunTrace(const Args& args);     // trace_verb.cc
int RunQueue(const Args& args);     // scheduling_verbs.cc
int RunQuota(const Args& args);

}  // namespace loom::client
