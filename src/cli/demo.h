// Sections of `diffattn demo` that live in their own files, so each can grow (or a new one be
// added) without touching the others. cmd_demo.cpp calls them in order.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace diffattn::cli {

// Trains a tiny DIFF V1 model and its standard twin for `steps` steps on the King James Bible,
// prints both loss curves side by side and a sample from each. `section` is the heading's
// number. A progress bar goes to stderr when it is a terminal.
void demo_language_model(std::ostream& os, int section, int64_t steps);

// Trains DIFF V1, DIFF V2 and a standard model for `steps` steps on multi-needle retrieval
// (about two minutes at the default 1500), prints the accuracy, attention-noise and model
// tables, and writes the report, its plots, heatmaps and the models into out_dir. A progress
// bar goes to stderr when it is a terminal.
void demo_retrieval(std::ostream& os, int section, const std::string& out_dir, int64_t steps);

}  // namespace diffattn::cli
