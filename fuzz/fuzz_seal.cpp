// Fuzz target: the data plane's seal decoder and replay window (dist/transport/Seal.h). The input's first
// 72 bytes are a seal as it arrives: one that decodes must encode back to the same bytes. The
// rest is a run of u16 counter steps (signed): the window must never accept a counter twice.
#include "dist/transport/Seal.h"
#include "fuzz/Fuzz.h"

#include <cstdlib>
#include <cstring>
#include <set>

std::vector<std::string> weftFuzzSeeds() {
  using namespace weft::dist;
  Seal seal;
  seal.kind = Seal::Tagged;
  seal.sender = endpointName(0, 1, 2, 1);
  seal.counter = 7;
  seal.tag = 0x30000;
  seal.payloadLength = 4096;
  std::array<uint8_t, Seal::kBytes> bytes{};
  seal.encodeInto(bytes);
  const std::string encoded(bytes.begin(), bytes.end());
  std::string steps;
  for (int i = 1; i <= 64; ++i) steps += weft::fuzz::littleEndian(static_cast<uint16_t>(i % 5 == 0 ? -3 : 1), 2);
  return {encoded, encoded + steps, encoded.substr(0, 40), std::string(72, '\0')};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft::dist;
  const std::span<const uint8_t> input(data, size);
  weft::fuzz::refusalsAllowed([&] {
    const Seal seal = Seal::decode(input);
    std::array<uint8_t, Seal::kBytes> again{};
    seal.encodeInto(again);
    if (std::memcmp(again.data(), data, Seal::kBytes) != 0) std::abort();
  });
  ReplayWindow window;
  std::set<uint64_t> accepted;
  uint64_t counter = 1;
  for (size_t at = Seal::kBytes; at + 2 <= size; at += 2) {
    int16_t step = 0;
    std::memcpy(&step, data + at, sizeof step);
    counter = static_cast<uint64_t>(std::max<int64_t>(1, static_cast<int64_t>(counter) + step * 37));
    if (window.accept(counter) && !accepted.insert(counter).second) std::abort();  // accepted twice
  }
  return 0;
}
