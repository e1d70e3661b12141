// STUB: the sluice command line (subcommands live in src/cli/cmd_*.cpp).
#include <cstdio>
int main() { std::puts("sluice"); return 0; }
