// preflight: the command-line entry point. Only dispatch lives here; each
// verb is its own file (GUIDE.md 1).
#include <cstdio>

int main() {
  std::puts("preflight: under construction");
  return 0;
}
