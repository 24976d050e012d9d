// Fuzz target: the parallel text reader (data/Translation.h). The input is the source file, a
// zero byte, then the target file.
#include "data/Translation.h"
#include "fuzz/Fuzz.h"

#include <algorithm>

std::vector<std::string> weftFuzzSeeds() {
  using namespace std::string_literals;
  return {"a b c\nd e\n\n"s + '\0' + "x y\nz\nw\n", "ok\nfine\n"s + '\0' + "ok\nbad \xC3\x28 here\n",
          "one\r\ntwo three\r\n"s + '\0' + "uno\r\ndos tres\r\n"};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* split = std::find(data, data + size, uint8_t{0});
  const std::string source = weft::fuzz::inputFile({data, static_cast<size_t>(split - data)}, "source");
  const uint8_t* rest = split == data + size ? split : split + 1;
  const std::string target = weft::fuzz::inputFile({rest, static_cast<size_t>(data + size - rest)}, "target");
  weft::fuzz::refusalsAllowed([&] {
    weft::data::ParallelTextOptions options;
    options.maxVocab = 50;
    options.maxLength = 8;
    weft::data::loadParallelText(source, target, options);
  });
  return 0;
}
