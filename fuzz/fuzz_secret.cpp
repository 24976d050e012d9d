// Fuzz target: the job secret file reader (dist/transport/Auth.h).
#include "dist/transport/Auth.h"
#include "fuzz/Fuzz.h"

std::vector<std::string> weftFuzzSeeds() {
  const std::string hex = weft::dist::toHex(weft::dist::Secret{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  return {hex + "\n", "  " + hex + "  \n\n", hex.substr(0, 40), "not a secret"};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = weft::fuzz::inputFile({data, size}, "secret", 0600);
  weft::fuzz::refusalsAllowed([&] { weft::dist::loadSecret(path); });
  return 0;
}
