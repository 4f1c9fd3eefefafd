// Entry point of gpu_kernels_test: every GPU_TEST linked in, or those whose
// name contains argv[1].
#include "tests/gpu/gpu_test.h"

int main(int argc, char** argv) { return loom::gpu_test::RunAll(argc, argv); }
