// Fuzz target: the text corpus and id file readers (data/TextCorpus.h).
#include "data/TextCorpus.h"
#include "fuzz/Fuzz.h"

std::vector<std::string> weftFuzzSeeds() {
  return {"the cat sat\n\n  the dog\tsat  \nthe end\r\n", "4 5 6\n\n7\n", "caf\xc3\xa9 \xe2\x82\xac\n4 x5\n",
          "1 2 3 4 5 6 7 8 9 10 11 12\n-1\n"};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = weft::fuzz::inputFile(data, size);
  weft::fuzz::refusalsAllowed([&] { weft::data::loadTextCorpus(path, 1, 1000); });
  weft::fuzz::refusalsAllowed([&] { weft::data::readIdFile(path, 100); });
  return 0;
}
