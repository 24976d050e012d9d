// Fuzz target: the checkpoint reader (readSafetensors, core/Checkpoint.h); seeds are files that
// writeSafetensors wrote.
#include "core/Checkpoint.h"
#include "fuzz/Fuzz.h"

std::vector<std::string> weftFuzzSeeds() {
  using namespace weft;
  TensorFile file;
  file.tensors["w"] = Tensor::fromVector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  file.tensors["step"] = Tensor::fromVector(std::vector<int64_t>{7}, {});
  file.tensors["ids"] = Tensor::fromVector(std::vector<int32_t>{1, 2}, {2});
  file.metadata.emplace("step", "7");
  const std::string path = fuzz::inputFile({}, "seed.safetensors");
  writeSafetensors(path, file);
  std::vector<std::string> seeds{fuzz::fileBytes(path)};
  TensorFile empty;
  writeSafetensors(path, empty);
  seeds.push_back(fuzz::fileBytes(path));
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = weft::fuzz::inputFile(data, size, "input.safetensors");
  weft::fuzz::refusalsAllowed([&] { weft::readSafetensors(path); });
  return 0;
}
