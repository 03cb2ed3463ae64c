// Sections of `diffattn demo` that live in their own files, so each can grow (or a new one be
// added) without touching the others. cmd_demo.cpp calls them in order.
#pragma once

#include <iosfwd>

namespace diffattn::cli {

// Trains a tiny DIFF V1 model and its standard twin on the King James Bible, prints both loss
// curves side by side and a sample from each. `section` is the heading's number.
void demo_language_model(std::ostream& os, int section);

}  // namespace diffattn::cli
