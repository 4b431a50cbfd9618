// troupe: the release command (no test hooks: it never reads fault injection from anywhere).
#include "cli/commands.h"

int main(int argc, char** argv) { return troupe::cli::troupe_main(argc, argv, {}); }
