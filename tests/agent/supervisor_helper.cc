// A stand-in for a node agent in the PDEATHSIG test: starts one child through
// a ProcessSupervisor, prints "child <pid>" and waits to be killed.
#include <unistd.h>

#include <cstdio>

#include "worker/agent/process_supervisor.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: supervisor_helper PROGRAM [ARGS...]\n");
    return 2;
  }
  loom::agent::ProcessSupervisor supervisor;
  loom::agent::ProcessSpec spec;
  spec.argv.assign(argv + 1, argv + argc);
  auto pid = supervisor.Launch(spec, nullptr);
  if (!pid.ok()) {
    fprintf(stderr, "launch failed: %s\n", std::string(pid.status().message()).c_str());
    return 1;
  }
  printf("child %d\n", *pid);
  fflush(stdout);
  while (true) pause();
}
