// Fuzz target: the JPEG and PNG decoders of image folders (data/ImageFolder.h: decodeImage).
#include "data/ImageFolder.h"
#include "fuzz/Fuzz.h"
#include "tests/ImageFiles.h"

namespace {

/// A 16x12 gradient of `channels` channels as a JPEG.
std::string jpegSeed(int channels, bool progressive) {
  std::vector<uint8_t> samples(static_cast<size_t>(16 * 12 * channels));
  for (size_t i = 0; i < samples.size(); ++i) samples[i] = static_cast<uint8_t>(i * 37 % 251);
  return weft::testing::jpegBytes(16, 12, channels, samples, 75, progressive);
}

}  // namespace

std::vector<std::string> weftFuzzSeeds() {
  // The smallest PNG: one transparent RGBA pixel.
  const std::string png("\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89"
                        "\0\0\0\nIDATx\x9c\x63\0\x01\0\0\x05\0\x01\x0d\x0a\x2d\xb4\0\0\0\0IEND\xae\x42\x60\x82",
                        67);
  return {png, jpegSeed(3, false), jpegSeed(3, true), jpegSeed(1, false), jpegSeed(4, false)};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = weft::fuzz::inputFile(data, size);
  weft::fuzz::refusalsAllowed([&] { weft::data::decodeImage(path); });
  return 0;
}
