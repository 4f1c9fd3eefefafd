// SIGUSR1 asks a rank to stop gracefully (docs/scheduling.md, "Preemption"):
// the way a batch system warns a job before its time limit (Slurm's
// `--signal=USR1@120`). The handler only sets a flag; the training loop reads
// it at the next step boundary (ControlMailbox::StopRequested), the whole job
// agrees to stop after that step, saves it and exits with kExitStopped.
// SIGTERM keeps its meaning: stop now (the agent's kill).
#pragma once

namespace loom::trainer {

// Installs the handler (once per process).
void InstallStopSignal();
// Whether SIGUSR1 arrived since InstallStopSignal.
bool StopSignalled();

}  // namespace loom::trainer
