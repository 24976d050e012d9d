// Fuzz target: the CIFAR-10 binary batch reader (data/Images.h).
#include "data/Images.h"
#include "fuzz/Fuzz.h"

std::vector<std::string> weftFuzzSeeds() {
  std::vector<std::string> seeds;
  std::string two;
  for (int label : {3, 9}) {
    two += static_cast<char>(label);
    for (size_t k = 1; k < weft::data::kCifar10RecordBytes; ++k) two += static_cast<char>(k * 7 + label);
  }
  seeds.push_back(two);
  seeds.push_back(two.substr(0, weft::data::kCifar10RecordBytes));
  seeds.push_back(two.substr(0, 100));
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = weft::fuzz::inputFile(data, size);
  weft::fuzz::refusalsAllowed([&] { weft::data::loadCifar10({path}); });
  return 0;
}
