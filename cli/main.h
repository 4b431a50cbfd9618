// The `troupe` command inside a program of your own: the program adds its model and data set
// kinds (models/extension.h) and hands its command line to troupe::main, and it is then the
// whole command (`./my_program run my.toml`, `agent`, `status`, `export`, ...). `troupe run`
// starts its local agents from the program's own executable, so every worker can build the
// program's kinds; agents started by hand must be the same program too (another refuses the job
// at its join, naming the kind it lacks).
//
//   int main(int argc, char** argv) {
//     troupe::models::Extensions ext;
//     ext.add_model(my_model_kind());
//     return troupe::main(argc, argv, ext);
//   }
#pragma once

#include "models/extension.h"

namespace troupe {

// Runs the command; returns the process exit code (0 done, 1 failed, 2 refused input).
int main(int argc, char** argv, const models::Extensions& extensions);

}  // namespace troupe
