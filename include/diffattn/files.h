// Files, the one way the project writes them: atomically (a temporary file beside the target,
// fsync, rename, fsync of the directory), so a crash or a full disk never leaves a user's file
// half-written. Every error is an IoError naming the path and the system's reason.
#pragma once

#include <string>

#include "diffattn/error.h"

namespace diffattn {

// Writes bytes to path atomically; creates no directories.
void write_file_atomic(const std::string& path, const std::string& bytes);
// The whole file.
std::string read_file(const std::string& path);
// Creates a directory and its missing parents; an error when it cannot, or when path exists
// and is not a directory.
void make_dirs(const std::string& path);

}  // namespace diffattn
