// main() of the GPU suite: without a usable GPU it lists what it would run, says why it cannot,
// and exits with 77, which CTest reports as "Skipped".
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "core/Device.h"

#include <cstdio>

int main(int argc, char** argv) {
  if (weft::cudaDeviceCount() > 0) return doctest::Context(argc, argv).run();
  // Counted, not run: the option goes on a command line (setOption skips a lone argument).
  const char* count[] = {argv[0], "--count"};
  doctest::Context(2, count).run();
  std::printf("weft: GPU test cases counted above were skipped: %s\n", weft::cudaUnavailableReason().c_str());
  return 77;
}
