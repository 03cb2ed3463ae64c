// The machine's memory: what sizes read from outside input (files, flags, tensors) are
// checked against before an allocation.
#pragma once

#include <cstdint>
#include <string>

namespace diffattn {

// Physical memory of this machine in bytes (0 if the system does not say).
int64_t memory_bytes();
// Throws InvalidArgument "<what> needs about X GiB, more than this machine's Y GiB of memory"
// when bytes exceeds memory_bytes(), or "... more than this process's limit (ulimit -v) of Y GiB
// of memory" when RLIMIT_AS, RLIMIT_DATA or the cgroup's memory.max is lower: called before an
// allocation whose size comes from a file or a flag, so it fails with words instead of
// std::bad_alloc, the OOM killer or a swap storm.
void check_fits_in_memory(double bytes, const std::string& what);

}  // namespace diffattn
