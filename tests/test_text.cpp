// Tests of the language data: Vocab, text corpora and id files, LM examples, and the synthetic
// language (determinism, Zipf emissions, exact probabilities).
#include "core/InputFile.h"
#include "data/SyntheticLanguage.h"
#include "data/TextCorpus.h"
#include "tests/InputTest.h"
#include "tests/TestUtil.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

using namespace weft;
using namespace weft::data;

namespace {

LanguageSpec tinySpec() {
  LanguageSpec s;
  s.vocab = 6;
  s.classes = 2;
  s.successors = 2;
  s.meanLength = 2.5;
  s.maxLength = 3;
  s.seed = 7;
  return s;
}

}  // namespace

TEST_CASE("Vocab starts with the four specials and adds words after them") {
  Vocab v;
  CHECK(v.size() == 4);
  CHECK(v.word(kPad) == "<pad>");
  CHECK(v.word(kUnk) == "<unk>");
  CHECK(v.word(kBos) == "<s>");
  CHECK(v.word(kEos) == "</s>");
  CHECK(v.add("cat") == 4);
  CHECK(v.add("dog") == 5);
  CHECK(v.add("cat") == 4);
  CHECK(v.id("dog") == 5);
  CHECK(v.id("emu") == kUnk);
  CHECK(contains(errorOf([&] { v.word(6); }), "id 6"));
  CHECK(contains(errorOf([&] { v.word(-1); }), "id -1"));
}

TEST_CASE("Vocab's lookups of many words at once give what one word at a time gives") {
  Vocab one, many;
  std::vector<std::string> words;
  for (int i = 0; i < 3000; ++i) words.push_back("w" + std::to_string(i * 7919 % 2000));  // repeats within
  const std::vector<std::string_view> views(words.begin(), words.end());
  std::vector<int32_t> added, looked;
  many.addAll(views, added);  // the table grows within the call
  for (size_t i = 0; i < words.size(); ++i) CHECK(added[i] == one.add(words[i]));
  CHECK(many.size() == one.size());
  std::vector<std::string> queries{"w1", "absent", "<s>", "w1999", ""};
  for (int i = 0; i < 200; ++i) queries.push_back("w" + std::to_string(i * 37));
  const std::vector<std::string_view> queryViews(queries.begin(), queries.end());
  many.ids(queryViews, looked);
  REQUIRE(looked.size() == queries.size());
  for (size_t i = 0; i < queries.size(); ++i) CHECK(looked[i] == one.id(queries[i]));
  CHECK(looked[1] == kUnk);
  CHECK(looked[2] == kBos);
}

TEST_CASE("Vocab::build orders by count then word, and applies minCount and maxSize") {
  const std::map<std::string, int64_t> counts{{"b", 5}, {"a", 5}, {"c", 9}, {"rare", 1}, {"d", 2}, {"<s>", 100}};
  const Vocab all = Vocab::build(counts, 2, 100);
  REQUIRE(all.size() == 8);
  CHECK(all.word(4) == "c");
  CHECK(all.word(5) == "a");
  CHECK(all.word(6) == "b");
  CHECK(all.word(7) == "d");
  CHECK(all.id("rare") == kUnk);
  CHECK(all.id("<s>") == kBos);
  const Vocab capped = Vocab::build(counts, 1, 6);
  CHECK(capped.size() == 6);
  CHECK(capped.id("b") == kUnk);
  CHECK(contains(errorOf([&] { Vocab::build(counts, 1, 3); }), "maxSize 3"));
}

TEST_CASE("Vocab save and load round-trip") {
  TempDir dir;
  Vocab v;
  v.add("héllo");
  v.add("world");
  const std::string file = (dir.path / "vocab.txt").string();
  v.save(file);
  const Vocab back = Vocab::load(file);
  REQUIRE(back.size() == v.size());
  for (int32_t i = 0; i < v.size(); ++i) CHECK(back.word(i) == v.word(i));
  CHECK(back.id("world") == 5);
}

TEST_CASE("Vocab::load names the file and line of each error") {
  TempDir dir;
  const std::string header = "<pad>\n<unk>\n<s>\n</s>\n";
  CHECK(contains(errorOf([&] { Vocab::load((dir.path / "none.txt").string()); }), "none.txt"));
  const std::string empty = dir.write("empty.txt", header + "a\n\nb\n");
  CHECK(contains(errorOf([&] { Vocab::load(empty); }), empty + ":6: empty line"));
  const std::string dup = dir.write("dup.txt", header + "a\nb\na\n");
  const std::string dupError = errorOf([&] { Vocab::load(dup); });
  CHECK(contains(dupError, dup + ":7: duplicate word 'a'"));
  CHECK(contains(dupError, "line 5"));
  const std::string utf = dir.write("utf.txt", header + "ok\nb\xff" "c\n");
  CHECK(contains(errorOf([&] { Vocab::load(utf); }), utf + ":6: invalid UTF-8 at byte 1"));
  const std::string noSpecials = dir.write("nospecials.txt", "a\nb\n");
  CHECK(contains(errorOf([&] { Vocab::load(noSpecials); }), noSpecials + ":1: expected the special word '<pad>'"));
  const std::string shortFile = dir.write("short.txt", "<pad>\n<unk>\n");
  CHECK(contains(errorOf([&] { Vocab::load(shortFile); }), "2 lines"));
}

TEST_CASE("a word list as 1B-Word ships it: counts beside the words, its markers as the specials, cut at maxSize") {
  TempDir dir;
  const std::string path = dir.write("vocab.txt", "<S> 30301028\n</S> 30301028\n<UNK> 0\nthe 41767866\n,\t38500000\n"
                                                   "of 19000000\nzebra 3\n");
  const Vocab v = Vocab::loadWordList(path, 100);
  CHECK(v.size() == kFirstWordId + 4);
  CHECK(v.id("the") == kFirstWordId);
  CHECK(v.id(",") == kFirstWordId + 1);
  CHECK(v.id("zebra") == kFirstWordId + 3);
  CHECK(v.id("<S>") == kUnk);  // a marker is not a word: the corpus's <S> is no token of a sentence
  CHECK(v.word(kBos) == "<s>");
  const Vocab cut = Vocab::loadWordList(path, kFirstWordId + 2);
  CHECK(cut.size() == kFirstWordId + 2);
  CHECK(cut.id("of") == kUnk);
}

TEST_CASE("Vocab::loadWordList names the file and line of each error") {
  TempDir dir;
  const std::string dup = dir.write("dup.txt", "a 5\nb 4\na 3\n");
  CHECK(contains(errorOf([&] { Vocab::loadWordList(dup, 100); }), dup + ":3: duplicate word 'a' (first on line 1)"));
  const std::string twoMarkers = dir.write("markers.txt", "<S>\nb\n<s>\n");
  CHECK(contains(errorOf([&] { Vocab::loadWordList(twoMarkers, 100); }),
                 twoMarkers + ":3: duplicate word '<s>' (first on line 1)"));
  const std::string count = dir.write("count.txt", "a 5\nb many\n");
  CHECK(contains(errorOf([&] { Vocab::loadWordList(count, 100); }), count + ":2: the count 'many' is not a number"));
  const std::string negative = dir.write("negative.txt", "a -5\n");
  CHECK(
      contains(errorOf([&] { Vocab::loadWordList(negative, 100); }), negative + ":1: the count '-5' is not a number"));
  const std::string third = dir.write("third.txt", "a 5 x\n");
  CHECK(contains(errorOf([&] { Vocab::loadWordList(third, 100); }), third + ":1: 'x' after the word and its count"));
  const std::string empty = dir.write("empty.txt", "a\n  \nb\n");
  CHECK(contains(errorOf([&] { Vocab::loadWordList(empty, 100); }), empty + ":2: empty line"));
  CHECK(contains(errorOf([&] { Vocab::loadWordList(empty, 3); }), "maxSize 3 leaves no room"));
}

TEST_CASE("a corpus directory is its files in name order; subdirectories are not read") {
  TempDir dir;
  std::filesystem::create_directories(dir.path / "shards" / "nested");
  dir.write("shards/news-00002", "c d\n");
  dir.write("shards/news-00001", "a b\n\nb\n");
  dir.write("shards/nested/other", "x\n");
  const std::vector<std::string> files = corpusFiles((dir.path / "shards").string());
  CHECK(files == std::vector<std::string>{dir.file("shards/news-00001"), dir.file("shards/news-00002")});
  CHECK(corpusFiles(dir.file("shards/news-00001")) == std::vector<std::string>{dir.file("shards/news-00001")});
  std::filesystem::create_directories(dir.path / "none");
  CHECK(contains(errorOf([&] { corpusFiles((dir.path / "none").string()); }),
                 "directory " + dir.file("none") + " holds no files"));
}

TEST_CASE("packed sentences: every file's non-empty lines in order, unknown words as <unk>, cut at maxLength") {
  TempDir dir;
  const std::string first = dir.write("1.txt", "a b c\n\nb q\n"), second = dir.write("2.txt", "c c c c c\n");
  Vocab v;
  const int32_t a = v.add("a"), b = v.add("b"), c = v.add("c");
  const PackedSentences packed = readPackedSentences({first, second}, v, 4);
  REQUIRE(packed.size() == 3);
  auto words = [&](size_t i) { return std::vector<int32_t>(packed[i].begin(), packed[i].end()); };
  CHECK(words(0) == std::vector<int32_t>{a, b, c});
  CHECK(words(1) == std::vector<int32_t>{b, kUnk});
  CHECK(words(2) == std::vector<int32_t>{c, c, c, c});
  CHECK(packed.words() == 9);
}

namespace {

/// Three shard files of 700 lines each, every seventh line empty and the others 1 to 12 words of
/// w0..w39 (a few over maxLength 10): 1,800 sentences, so the scan's marks fall inside files.
std::vector<std::string> writeShards(TempDir& dir) {
  std::filesystem::create_directories(dir.path / "shards");
  std::vector<std::string> files;
  uint64_t state = 11;
  for (int f = 0; f < 3; ++f) {
    std::string text;
    for (int line = 0; line < 700; ++line) {
      state = state * 6364136223846793005u + 1442695040888963407u;
      const int words = line % 7 == 6 ? 0 : 1 + static_cast<int>((state >> 33) % 12);
      for (int w = 0; w < words; ++w) text += (w ? " w" : "w") + std::to_string((state >> (w + 7)) % 40);
      text += line % 7 == 6 && line % 2 ? "  \n" : "\n";
    }
    files.push_back(dir.write("shards/part-" + std::to_string(f), text));
  }
  return files;
}

Vocab wordsUpTo(int n) {
  Vocab v;
  for (int i = 0; i < n; ++i) v.add("w" + std::to_string(i));
  return v;
}

std::vector<int32_t> wordsOf(std::span<const int32_t> s) { return {s.begin(), s.end()}; }

}  // namespace

TEST_CASE("a corpus scan knows every sentence's length and the counts, holding no words") {
  TempDir dir;
  const std::vector<std::string> files = writeShards(dir);
  std::map<std::string, int64_t> counts;
  const CorpusScan scan = scanCorpus(files, 10, &counts);
  const PackedSentences whole = readPackedSentences(files, wordsUpTo(40), 10);
  REQUIRE(scan.lengths.size() == whole.size());
  CHECK(scan.lengths.size() == 1800);
  for (size_t i = 0; i < whole.size(); ++i) CHECK(scan.lengths[i] == whole[i].size());
  std::map<std::string, int64_t> expected;  // every token, those past maxLength too
  for (const std::string& file : files)
    for (const auto& [word, count] : countTokens(file)) expected[word] += count;
  CHECK(counts == expected);
  CHECK(scan.marks.size() == 2);  // sentences 0 and 1024
  CHECK(scan.marks[1].file == 1);
  CHECK(scanCorpus(files, 10).textHash == scan.textHash);
  const std::string one = dir.write("one.txt", "a b\nc\n"), cutElsewhere = dir.write("other.txt", "a\nb c\n");
  CHECK(scanCorpus({one}, 10).textHash != scanCorpus({cutElsewhere}, 10).textHash);
  dir.write("shards/part-1", "w1 w2\n");
  CHECK(scanCorpus(files, 10).textHash != scan.textHash);
  CHECK(contains(errorOf([&] { scanCorpus(files, 0); }), "cut to 1 to 65535 words, not 0"));
  CHECK(contains(errorOf([&] { scanCorpus(files, 70000); }), "not 70000"));
}

TEST_CASE("a range of sentences read alone equals that range of the whole corpus") {
  TempDir dir;
  const std::vector<std::string> files = writeShards(dir);
  const Vocab vocab = wordsUpTo(30);  // w30..w39 become <unk>
  const CorpusScan scan = scanCorpus(files, 10);
  const PackedSentences whole = readPackedSentences(files, vocab, 10);
  // Within a file, across a file's end, from a mark, ending at the corpus's end, and empty.
  for (const auto& [begin, end] :
       std::vector<std::pair<size_t, size_t>>{{0, 5}, {590, 610}, {1024, 1030}, {1020, 1800}, {1799, 1800}, {7, 7}}) {
    CAPTURE(begin);
    const PackedSentences range = readSentenceRange(scan, vocab, begin, end);
    REQUIRE(range.size() == end - begin);
    for (size_t i = begin; i < end; ++i) CHECK(wordsOf(range[i - begin]) == wordsOf(whole[i]));
  }
  CHECK(contains(errorOf([&] { readSentenceRange(scan, vocab, 10, 1801); }),
                 "sentences [10, 1801) of a text "
                 "corpus of 1800"));
}

TEST_CASE("a corpus file changed after its scan is named when its sentences are read") {
  TempDir dir;
  const std::vector<std::string> files = writeShards(dir);
  const CorpusScan scan = scanCorpus(files, 10);
  {
    // The line of sentence 1024, where the read seeks to, gets another length: named by its line.
    std::vector<std::string> lines;
    std::ifstream in(files[1]);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    const auto changed = static_cast<size_t>(scan.marks[1].line);
    lines[changed] = scan.lengths[1024] == 1 ? "w1 w2" : "w1";
    std::string text;
    for (const std::string& line : lines) text += line + "\n";
    const std::string original = dir.write("original", "");
    std::filesystem::copy_file(files[1], original, std::filesystem::copy_options::overwrite_existing);
    dir.write("shards/part-1", text);
    const std::string error = errorOf([&] { readSentenceRange(scan, wordsUpTo(40), 1030, 1040); });
    CHECK_MESSAGE(contains(error, files[1] + ":" + std::to_string(changed + 1) + ": the line has"), error);
    CHECK(contains(error, "for sentence 1024"));
    std::filesystem::copy_file(original, files[1], std::filesystem::copy_options::overwrite_existing);
  }
  dir.write("shards/part-2", "w1\nw1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13\n");
  const std::string changed = errorOf([&] { readSentenceRange(scan, wordsUpTo(40), 1700, 1800); });
  CHECK_MESSAGE(contains(changed, files[2] + ":"), changed);
  CHECK(contains(changed, "this file, or one before it, changed while the job ran"));
  const CorpusScan short_ = scanCorpus(files, 10);
  dir.write("shards/part-2", "w1\n");
  CHECK(contains(errorOf([&] { readSentenceRange(short_, wordsUpTo(40), 1200, 1202); }),
                 files[2] + " ended 1 sentences before the corpus's first reading did"));
}

TEST_CASE("an LM dataset of streams reads a stream's sentences when its first example is made, no other") {
  TempDir dir;
  std::filesystem::create_directories(dir.path / "shards");
  std::vector<std::string> files;
  for (int f = 0; f < 4; ++f) {  // a file a stream: 5 sentences each
    std::string text;
    for (int line = 0; line < 5; ++line) text += "w" + std::to_string(f) + std::string(line % 3 + 1, 'x') + " w9\n";
    files.push_back(dir.write("shards/" + std::to_string(f), text));
  }
  Vocab vocab = wordsUpTo(10);
  for (int f = 0; f < 4; ++f)
    for (int n = 1; n <= 3; ++n) vocab.add("w" + std::to_string(f) + std::string(n, 'x'));
  auto scan = std::make_shared<const CorpusScan>(scanCorpus(files, 10));
  const Dataset streams = lmStreams(scan, vocab, 20, 4);
  const PackedSentences whole = readPackedSentences(files, vocab, 10);
  // Streams 2 and 3 are never read: their files may go.
  std::filesystem::remove(files[2]);
  std::filesystem::remove(files[3]);
  for (size_t i = 0; i < 10; ++i) {
    CAPTURE(i);
    const Example made = streams.example(i), expected = lmExample(whole[i]);
    CHECK(made.at("tokens").toDoubles() == expected.at("tokens").toDoubles());
    CHECK(made.at("targets").toDoubles() == expected.at("targets").toDoubles());
  }
  for (size_t i = 0; i < 20; ++i) CHECK(streams.length(i, "tokens") == 3);  // told by the scan
  CHECK(contains(errorOf([&] { streams.example(10); }), files[2] + " does not exist"));
  // The data's identity is its text and vocabulary.
  CHECK(streams.hash() == lmStreams(scan, vocab, 20, 2).hash());
  CHECK(streams.hash() != lmStreams(scan, vocab, 19, 4).hash());
  Vocab other = vocab;
  other.add("w10");
  CHECK(streams.hash() != lmStreams(scan, other, 20, 4).hash());
  CHECK(contains(errorOf([&] { lmStreams(scan, vocab, 3, 4); }), "3 sentences cannot make 4 streams"));
}

TEST_CASE("invalidUtf8Offset finds the first bad sequence") {
  CHECK(invalidUtf8Offset("plain ascii") == -1);
  CHECK(invalidUtf8Offset("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") == -1);
  CHECK(invalidUtf8Offset("ab\x80") == 2);           // stray continuation byte
  CHECK(invalidUtf8Offset("a\xc3") == 1);            // truncated
  CHECK(invalidUtf8Offset("\xc0\xaf") == 0);         // overlong
  CHECK(invalidUtf8Offset("x\xed\xa0\x80") == 1);    // surrogate
  CHECK(invalidUtf8Offset("\xf4\x90\x80\x80") == 0); // past U+10FFFF
}

TEST_CASE("a text corpus is counted, given a vocabulary and turned into ids") {
  TempDir dir;
  const std::string file = dir.write("corpus.txt", "the cat sat\n\n  the dog\tsat  \nthe end\r\n");
  const auto counts = countTokens(file);
  CHECK(counts.at("the") == 3);
  CHECK(counts.at("sat") == 2);
  CHECK(counts.at("cat") == 1);
  const TextCorpus c = loadTextCorpus(file, 2, 100);
  CHECK(c.vocab.size() == 6);
  CHECK(c.vocab.word(4) == "the");
  CHECK(c.vocab.word(5) == "sat");
  REQUIRE(c.sentences.size() == 3);  // the empty line is skipped
  CHECK(c.sentences[0] == std::vector<int32_t>{4, kUnk, 5});
  CHECK(c.sentences[1] == std::vector<int32_t>{4, kUnk, 5});
  CHECK(c.sentences[2] == std::vector<int32_t>{4, kUnk});
  CHECK(withBoundaries(c.sentences[2]) == std::vector<int32_t>{kBos, 4, kUnk, kEos});
}

TEST_CASE("text corpus errors name the file and line") {
  TempDir dir;
  const std::string missing = (dir.path / "missing.txt").string();
  CHECK(contains(errorOf([&] { countTokens(missing); }), missing));
  const std::string bad = dir.write("bad.txt", "fine line\nstill fine\nbroken \xe2\x82 here\n");
  CHECK(contains(errorOf([&] { loadTextCorpus(bad, 1, 100); }), bad + ":3: invalid UTF-8 at byte 7"));
  CHECK(contains(errorOf([&] { readSentences(bad, Vocab()); }), bad + ":3"));
}

TEST_CASE("pre-tokenised id files are read and their ids checked") {
  TempDir dir;
  const std::string good = dir.write("ids.txt", "4 5 6\n\n7\n");
  const auto s = readIdFile(good, 8);
  REQUIRE(s.size() == 2);
  CHECK(s[0] == std::vector<int32_t>{4, 5, 6});
  CHECK(s[1] == std::vector<int32_t>{7});
  CHECK(contains(errorOf([&] { readIdFile(good, 7); }), good + ":3: id 7 is outside the vocabulary of 7 ids"));
  const std::string negative = dir.write("neg.txt", "4\n-1\n");
  CHECK(contains(errorOf([&] { readIdFile(negative, 8); }), negative + ":2: id -1"));
  const std::string word = dir.write("word.txt", "4 x5\n");
  CHECK(contains(errorOf([&] { readIdFile(word, 8); }), word + ":1: 'x5' is not an id"));
  CHECK(contains(errorOf([&] { readIdFile((dir.path / "none").string(), 8); }), "none"));
}

TEST_CASE("LM examples shift the sentence by one and batch with masks") {
  const Example e = lmExample(std::vector<int32_t>{7, 8, 9});
  CHECK(e.at("tokens").toVector<int32_t>() == std::vector<int32_t>{kBos, 7, 8, 9});
  CHECK(e.at("targets").toVector<int32_t>() == std::vector<int32_t>{7, 8, 9, kEos});
  const Dataset d = lmDataset({{7, 8, 9}, {5}});
  BatchOptions o;
  o.batchSize = 2;
  o.shuffle = false;
  o.padded = {"tokens", "targets"};
  Batcher batcher(d, o);
  const Batch b = batcher.next();
  CHECK(b.at("targets").shape() == Shape{2, 4});
  CHECK(b.at("targets").toVector<int32_t>() == std::vector<int32_t>{7, 8, 9, kEos, 5, kEos, kPad, kPad});
  const std::vector<double> mask = b.at("targets_mask").toDoubles();
  const double expected[] = {1, 1, 1, 1, 1, 1, 0, 0};
  REQUIRE(mask.size() == 8);
  for (size_t i = 0; i < 8; ++i) CHECK(mask[i] == expected[i]);
}

TEST_CASE("the synthetic language is a deterministic function of (seed, index)") {
  const SyntheticLanguage a{LanguageSpec{}}, b{LanguageSpec{}};
  LanguageSpec other;
  other.seed = 2;
  const SyntheticLanguage c{other};
  int differing = 0;
  for (uint64_t i = 0; i < 50; ++i) {
    const auto s = a.sentence(i);
    CHECK(s == b.sentence(i));
    CHECK(s == a.sentence(i));
    differing += s != c.sentence(i);
    REQUIRE(!s.empty());
    CHECK(static_cast<int64_t>(s.size()) <= a.spec().maxLength);
    for (const int32_t w : s) CHECK((w >= kFirstWordId && w < kFirstWordId + a.spec().vocab));
  }
  CHECK(differing > 40);
  CHECK(a.sentence(3) != a.sentence(4));
}

TEST_CASE("a sentence's length is told without drawing it, as drawing it would give") {
  LanguageSpec spec;
  spec.maxLength = 12;  // some sentences stop at the cap
  const SyntheticLanguage language{spec};
  bool capped = false;
  for (uint64_t i = 0; i < 500; ++i) {
    const auto length = static_cast<int64_t>(language.sentence(i).size());
    CHECK(language.sentenceLength(i) == length);
    capped |= length == spec.maxLength;
  }
  CHECK(capped);
}

TEST_CASE("the language's LM dataset makes sentence i as lmExample would, and tells its lengths") {
  const auto language = std::make_shared<const SyntheticLanguage>(LanguageSpec{});
  const Dataset d = lmDataset(language, 30);
  CHECK(d.isGenerated());
  REQUIRE(d.size() == 30);
  for (size_t i = 0; i < d.size(); ++i) {
    const Example expected = lmExample(language->sentence(i));
    CHECK(d.example(i).at("tokens").toVector<int32_t>() == expected.at("tokens").toVector<int32_t>());
    CHECK(d.example(i).at("targets").toVector<int32_t>() == expected.at("targets").toVector<int32_t>());
    CHECK(d.length(i, "tokens") == expected.at("tokens").numel());
  }
  CHECK(d.hash() == lmDataset(language, 30).hash());
  CHECK(d.hash() != lmDataset(language, 31).hash());
  LanguageSpec other;
  other.zipf = 1.1;
  CHECK(d.hash() != lmDataset(std::make_shared<const SyntheticLanguage>(other), 30).hash());
}

TEST_CASE("the synthetic language's words follow each class's Zipf distribution") {
  const LanguageSpec spec;
  const SyntheticLanguage lang(spec);
  const int64_t k = spec.classes;
  // Word 4 + r * K + c has in-class rank r.
  for (const int64_t r : {1, 9, 99}) {
    CHECK(lang.emissionProb(static_cast<int32_t>(kFirstWordId + r * k)) / lang.emissionProb(kFirstWordId) ==
          doctest::Approx(std::pow(static_cast<double>(r + 1), -spec.zipf)));
  }
  double total = 0;
  for (int64_t r = 0; r * k < spec.vocab; ++r) total += lang.emissionProb(static_cast<int32_t>(kFirstWordId + r * k));
  CHECK(total == doctest::Approx(1.0));
  // Empirical in-class frequencies of the top ranks match the emissions.
  std::map<int64_t, std::map<int64_t, double>> counts;  // class -> rank -> count
  std::map<int64_t, double> classTotals;
  for (uint64_t i = 0; i < 4000; ++i) {
    for (const int32_t w : lang.sentence(i)) {
      counts[lang.classOf(w)][(w - kFirstWordId) / k] += 1;
      classTotals[lang.classOf(w)] += 1;
    }
  }
  const auto busiest = std::max_element(classTotals.begin(), classTotals.end(),
                                        [](const auto& x, const auto& y) { return x.second < y.second; });
  const int64_t cls = busiest->first;
  REQUIRE(busiest->second > 3000);
  for (int64_t r = 0; r < 4; ++r) {
    const double expected = lang.emissionProb(static_cast<int32_t>(kFirstWordId + r * k + cls));
    CHECK(counts[cls][r] / busiest->second == doctest::Approx(expected).epsilon(0.15));
  }
  CHECK(lang.vocab().size() == spec.vocab + 4);
  CHECK(lang.vocab().id("w4") == 4);
  CHECK(lang.vocab().word(kFirstWordId + 10) == "w14");
}

TEST_CASE("synthetic sentence probabilities sum to one and match sampling frequencies") {
  const SyntheticLanguage lang(tinySpec());
  // Every sentence of 1..maxLength words over 6 words.
  double total = 0;
  std::map<std::vector<int32_t>, double> prob;
  std::vector<std::vector<int32_t>> frontier{{}};
  for (int64_t len = 1; len <= 3; ++len) {
    std::vector<std::vector<int32_t>> next;
    for (const auto& s : frontier) {
      for (int32_t w = 4; w < 10; ++w) {
        auto t = s;
        t.push_back(w);
        const double p = std::exp(lang.logProb(t));
        total += p;
        prob[t] = p;
        next.push_back(t);
      }
    }
    frontier = next;
  }
  CHECK(total == doctest::Approx(1.0).epsilon(1e-12));
  std::map<std::vector<int32_t>, double> seen;
  const int n = 20000;
  for (uint64_t i = 0; i < n; ++i) seen[lang.sentence(i)] += 1.0 / n;
  for (const auto& [s, freq] : seen) {
    REQUIRE(prob.count(s) == 1);
    CHECK(std::abs(freq - prob[s]) < 4 * std::sqrt(prob[s] / n) + 1e-3);
  }
}

TEST_CASE("true perplexity is exp of the negated mean log-probability per token") {
  const SyntheticLanguage lang(tinySpec());
  double logProbSum = 0, tokens = 0;
  for (uint64_t i = 10; i < 30; ++i) {
    const auto s = lang.sentence(i);
    logProbSum += lang.logProb(s);
    tokens += static_cast<double>(s.size()) + 1;
  }
  CHECK(lang.truePerplexity(10, 30) == doctest::Approx(std::exp(-logProbSum / tokens)).epsilon(1e-12));
  CHECK(lang.logProb({}) == -std::numeric_limits<double>::infinity());
  CHECK(lang.logProb({4, 4, 4, 4}) == -std::numeric_limits<double>::infinity());  // longer than maxLength
  CHECK(contains(errorOf([&] { lang.logProb({4, 10}); }), "id 10 at position 1"));
  CHECK(contains(errorOf([&] { lang.truePerplexity(5, 5); }), "empty range"));
  LanguageSpec bad;
  bad.successors = 0;
  CHECK(contains(errorOf([&] { SyntheticLanguage{bad}; }), "successors 0"));
}

TEST_CASE("text loaders refuse what is not a regular file instead of blocking or reading for ever") {
  TempDir dir;
  // A directory used to read as an empty corpus, a device as an endless (/dev/zero) or empty one.
  CHECK(contains(errorOf([&] { countTokens(dir.path.string()); }), dir.path.string() + " is a directory"));
  CHECK(contains(errorOf([&] { readIdFile("/dev/null", 8); }), "/dev/null is a character device"));
  CHECK(contains(errorOf([&] { Vocab::load(dir.path.string()); }), "is a directory"));
  const std::string fifo = makeFifo(dir, "corpus.fifo");
  CHECK(contains(fifoError(fifo, [&] { countTokens(fifo); }), fifo + " is a FIFO"));
  CHECK(contains(fifoError(fifo, [&] { Vocab::load(fifo); }), fifo + " is a FIFO"));
}

TEST_CASE("a line over the limit is an error naming the file and line") {
  TempDir dir;
  const std::string path = dir.write("long.txt", "a b\n" + std::string(kMaxLineBytes + 1, 'w') + "\n");
  CHECK(contains(errorOf([&] { countTokens(path); }), path + ":2: the line is longer than the limit of"));
}

TEST_CASE("text loader errors escape the bytes they quote") {
  TempDir dir;
  const std::string ids = dir.write("ids.txt", "4 \x1b[2J\x1b]0;x\x07\n");
  const std::string idError = errorOf([&] { readIdFile(ids, 8); });
  CHECK(contains(idError, ids + ":1: '\\x1b[2J\\x1b]0;x\\x07' is not an id"));
  CHECK_FALSE(contains(idError, "\x1b"));
  const std::string vocab = dir.write("vocab.txt", "<pad>\n<unk>\n<s>\n</s>\n\x1b[1m\n\x1b[1m\n");
  const std::string vocabError = errorOf([&] { Vocab::load(vocab); });
  CHECK(contains(vocabError, vocab + ":6: duplicate word '\\x1b[1m' (first on line 5)"));
  CHECK_FALSE(contains(vocabError, "\x1b"));
  const std::string specials = dir.write("specials.txt", "\x9b\n");
  CHECK(contains(errorOf([&] { Vocab::load(specials); }), ":1: invalid UTF-8 at byte 0"));
  const std::string c1 = dir.write("c1.txt",
                                   "\xc2\x9b"
                                   "2J\n");
  CHECK(contains(errorOf([&] { Vocab::load(c1); }), "found '\\xc2\\x9b2J'"));
}
