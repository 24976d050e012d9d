// Fuzz target: the vocabulary file reader (Vocab::load).
#include "data/Vocab.h"
#include "fuzz/Fuzz.h"

std::vector<std::string> weftFuzzSeeds() {
  const std::string specials = "<pad>\n<unk>\n<s>\n</s>\n";
  return {specials + "the\ncat\r\nsat\n", specials, specials + "a\n\nb\n", specials + "caf\xc3\xa9\na\na\n"};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = weft::fuzz::inputFile(data, size);
  weft::fuzz::refusalsAllowed([&] {
    const weft::data::Vocab v = weft::data::Vocab::load(path);
    for (int32_t id = 0; id < v.size(); ++id) {
      if (v.id(v.word(id)) != id) std::abort();  // the two tables must agree
    }
  });
  return 0;
}
