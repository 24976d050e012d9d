// Fuzz target: the vocabulary file readers (Vocab::load, and Vocab::loadWordList for corpora's word lists).
#include "data/Vocab.h"
#include "fuzz/Fuzz.h"

std::vector<std::string> weftFuzzSeeds() {
  const std::string specials = "<pad>\n<unk>\n<s>\n</s>\n";
  return {specials + "the\ncat\r\nsat\n", specials, specials + "a\n\nb\n", specials + "caf\xc3\xa9\na\na\n",
          "<S> 30\n</S> 30\n<UNK> 0\nthe 41767866\n,\t385\n", "a 5\n<s>\nb x\n"};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = weft::fuzz::inputFile(data, size);
  // The two tables must agree.
  const auto checkTables = [](const weft::data::Vocab& v) {
    for (int32_t id = 0; id < v.size(); ++id) {
      if (v.id(v.word(id)) != id) std::abort();
    }
  };
  weft::fuzz::refusalsAllowed([&] { checkTables(weft::data::Vocab::load(path)); });
  weft::fuzz::refusalsAllowed([&] { checkTables(weft::data::Vocab::loadWordList(path, 1 << 20)); });
  return 0;
}
