// The number of threads the library's kernels use (process-wide).
// DIFFATTN_NUM_THREADS in the environment sets the starting value (default: every hardware
// thread OpenMP sees); set_num_threads changes it; the CLI's --threads N calls it.
#pragma once

namespace diffattn::kernels {

int num_threads();
// n >= 1; throws InvalidArgument otherwise. Layers that call BLAS follow this value too.
void set_num_threads(int n);
// Whether idle OpenMP threads sleep between parallel regions (OMP_WAIT_POLICY=passive, which
// the CLI sets on a busy machine): then each region pays a wake-up, and small calls should run
// on fewer threads. Read once, from the environment (libgomp reads it once too).
bool idle_threads_sleep();

}  // namespace diffattn::kernels
