// The synthetic translation task and the parallel-text loader.
#include "core/InputFile.h"
#include "data/Translation.h"
#include "tests/InputTest.h"
#include "tests/TestUtil.h"

#include <fmt/format.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

using namespace weft;
using namespace weft::data;

namespace {

std::vector<int32_t> ids(const Tensor& t) { return t.toVector<int32_t>(); }

}  // namespace

TEST_CASE("translation task: sentences and the word mapping are deterministic") {
  const TranslationTask a{TranslationSpec{}}, b{TranslationSpec{}};
  for (uint64_t i = 0; i < 50; ++i) CHECK(a.source(i) == b.source(i));
  for (int32_t w = 0; w < a.vocabSize(); ++w) CHECK(a.mapWord(w) == b.mapWord(w));
  TranslationSpec other;
  other.seed = 2;
  const TranslationTask c(other);
  int32_t differ = 0;
  for (int32_t w = kFirstWordId; w < a.vocabSize(); ++w) differ += a.mapWord(w) != c.mapWord(w);
  CHECK(differ > a.vocabSize() / 2);
  CHECK(a.source(0) == c.source(0));  // the seed fixes the mapping, not the language
}

TEST_CASE("translation task: sources are words of the small language within the length range") {
  const TranslationTask task{TranslationSpec{}};
  CHECK(task.vocabSize() == 2000 + kFirstWordId);
  std::set<std::vector<int32_t>> distinct;
  for (uint64_t i = 0; i < 300; ++i) {
    const std::vector<int32_t> s = task.source(i);
    CHECK(s.size() >= 4);
    CHECK(s.size() <= 12);
    for (int32_t w : s) {
      CHECK(w >= kFirstWordId);
      CHECK(w < task.vocabSize());
    }
    distinct.insert(s);
  }
  CHECK(distinct.size() > 290);
}

TEST_CASE("translation task: the mapping is a bijection on words that fixes the specials") {
  const TranslationTask task{TranslationSpec{}};
  std::set<int32_t> images;
  for (int32_t w = 0; w < task.vocabSize(); ++w) images.insert(task.mapWord(w));
  CHECK(static_cast<int32_t>(images.size()) == task.vocabSize());
  CHECK(*images.begin() == 0);
  CHECK(*images.rbegin() == task.vocabSize() - 1);
  for (int32_t s : {kPad, kUnk, kBos, kEos}) CHECK(task.mapWord(s) == s);
  CHECK(contains(errorOf([&] { task.mapWord(task.vocabSize()); }), "word id 2004"));
}

TEST_CASE("translation task: the target swaps adjacent source words, then maps each") {
  const TranslationTask task{TranslationSpec{}};
  // Position j of the target holds the source word at j ^ 1 (its pair partner), or at j itself
  // for an unpaired last word.
  for (uint64_t i = 0; i < 100; ++i) {
    const std::vector<int32_t> s = task.source(i), t = task.translate(s);
    REQUIRE(t.size() == s.size());
    for (size_t j = 0; j < s.size(); ++j) {
      const size_t from = (j ^ 1) < s.size() ? (j ^ 1) : j;
      CHECK(t[j] == task.mapWord(s[from]));
    }
  }
  CHECK(task.translate({10, 11, 12}) == std::vector<int32_t>{task.mapWord(11), task.mapWord(10), task.mapWord(12)});
}

TEST_CASE("translation task: examples carry </s> and <s> where the fields say") {
  const TranslationTask task{TranslationSpec{}};
  const Dataset set = task.examples(5, 8);
  REQUIRE(set.size() == 3);
  for (size_t k = 0; k < 3; ++k) {
    const std::vector<int32_t> s = task.source(5 + k), t = task.translate(s);
    std::vector<int32_t> src = s, in{kBos}, out = t;
    src.push_back(kEos);
    in.insert(in.end(), t.begin(), t.end());
    out.push_back(kEos);
    CHECK(ids(set[k].at("source")) == src);
    CHECK(ids(set[k].at("target_in")) == in);
    CHECK(ids(set[k].at("target_out")) == out);
  }
}

TEST_CASE("translation task: a Batcher pads the fields and adds their masks") {
  const TranslationTask task{TranslationSpec{}};
  Batcher batcher(task.examples(0, 16),
                  {.batchSize = 4, .shuffle = false, .padded = {"source", "target_in", "target_out"}, .counted = {}});
  const Batch b = batcher.next();
  for (const char* f : {"source", "target_in", "target_out"}) {
    REQUIRE(b.count(f));
    REQUIRE(b.count(std::string(f) + "_mask"));
    CHECK(b.at(f).dtype() == i32);
    CHECK(b.at(f).shape()[0] == 4);
    CHECK(b.at(std::string(f) + "_mask").shape() == b.at(f).shape());
  }
  const std::vector<double> mask = b.at("source_mask").toDoubles();
  double real = 0;
  for (double m : mask) real += m;
  double expected = 0;
  for (uint64_t i = 0; i < 4; ++i) expected += static_cast<double>(task.source(i).size() + 1);
  CHECK(real == expected);
}

TEST_CASE("translation task: a minimum length the language cannot reach is an error") {
  TranslationSpec spec;
  spec.minLength = 13;
  CHECK(contains(errorOf([&] { TranslationTask{spec}; }), "minLength 13"));
}

TEST_CASE("parallel text: loads aligned files, builds both vocabularies, skips empty pairs") {
  TempDir dir;
  const std::string src = dir.write("a.src", "the cat sat\r\nthe dog\n\n  a  cat  \nthe end");
  const std::string tgt = dir.write("a.tgt", "le chat\nle chien\nrien\nun chat\nle fin\n");
  const ParallelText text = loadParallelText(src, tgt);
  CHECK(text.skipped == 1);  // line 3: empty source
  REQUIRE(text.examples.size() == 4);
  CHECK(text.source.id("the") == kFirstWordId);  // most frequent first
  CHECK(text.target.id("le") == kFirstWordId);
  CHECK(text.source.id("rien") == kUnk);
  const Example& e = text.examples[2];
  CHECK(ids(e.at("source")) == std::vector<int32_t>{text.source.id("a"), text.source.id("cat"), kEos});
  CHECK(ids(e.at("target_in")) == std::vector<int32_t>{kBos, text.target.id("un"), text.target.id("chat")});
  CHECK(ids(e.at("target_out")) == std::vector<int32_t>{text.target.id("un"), text.target.id("chat"), kEos});
  CHECK(text.source.word(ids(text.examples[0].at("source"))[2]) == "sat");  // "\r" dropped
}

TEST_CASE("parallel text: min count, vocabulary cap and maximum length") {
  TempDir dir;
  const std::string src = dir.write("b.src", "x x x y\nx y z\nx y z w v u\n");
  const std::string tgt = dir.write("b.tgt", "p q\np q r\np\n");
  ParallelTextOptions options;
  options.minCount = 2;
  options.maxLength = 4;
  const ParallelText text = loadParallelText(src, tgt, options);
  CHECK(text.skipped == 1);
  CHECK(text.source.size() == kFirstWordId + 2);  // x, y; z seen once among kept pairs
  CHECK(text.source.id("z") == kUnk);
  options = {};
  options.maxVocab = kFirstWordId + 1;
  CHECK(loadParallelText(src, tgt, options).source.size() == kFirstWordId + 1);
}

TEST_CASE("parallel text: a missing file is named") {
  TempDir dir;
  const std::string tgt = dir.write("c.tgt", "a\n");
  const std::string missing = dir.file("nope.src");
  const std::string message = errorOf([&] { loadParallelText(missing, tgt); });
  CHECK(contains(message, missing));
  CHECK(contains(message, "does not exist"));
  CHECK(contains(errorOf([&] { loadParallelText(tgt, missing); }), missing));
}

TEST_CASE("parallel text: files with different line counts name both files and counts") {
  TempDir dir;
  const std::string src = dir.write("d.src", "a\nb\nc\n");
  const std::string tgt = dir.write("d.tgt", "a\nb\n");
  const std::string message = errorOf([&] { loadParallelText(src, tgt); });
  CHECK(contains(message, "'" + src + "' has 3 lines"));
  CHECK(contains(message, "'" + tgt + "' has 2"));
}

TEST_CASE("parallel text: invalid UTF-8 names the file, line and byte") {
  TempDir dir;
  const std::string src = dir.write("e.src", "ok\nfine\n");
  const std::string tgt = dir.write("e.tgt", "ok\nbad \xC3\x28 here\n");
  const std::string message = errorOf([&] { loadParallelText(src, tgt); });
  CHECK(contains(message, tgt + ":2"));
  CHECK(contains(message, "invalid UTF-8 at byte 4"));
}

TEST_CASE("parallel text: a line over the limit, a device or a FIFO is refused, naming the file") {
  TempDir dir;
  const std::string src = dir.write("f.src", "a\n" + std::string(kMaxLineBytes + 1, 'b') + "\n");
  const std::string tgt = dir.write("f.tgt", "a\nb\n");
  CHECK(contains(errorOf([&] { loadParallelText(src, tgt); }), src + ":2: the line is longer than the limit of"));
  CHECK(contains(errorOf([&] { loadParallelText(tgt, "/dev/null"); }), "/dev/null is a character device"));
  const std::string fifo = makeFifo(dir, "g.fifo");
  CHECK(contains(fifoError(fifo, [&] { loadParallelText(tgt, fifo); }), fifo + " is a FIFO"));
}

namespace {

/// Aligned files of `pairs` lines whose every 7th source line is empty (a skipped pair); line i
/// has 1 + i % 5 source words and 1 + i % 3 target words, of 40 and 30 word types.
std::pair<std::string, std::string> writeParallel(const TempDir& dir, int pairs) {
  std::string src, tgt;
  for (int i = 0; i < pairs; ++i) {
    if (i % 7 != 3)
      for (int w = 0; w <= i % 5; ++w) src += fmt::format("{}s{}", w ? " " : "", (i * 11 + w * 3) % 40);
    for (int w = 0; w <= i % 3; ++w) tgt += fmt::format("{}t{}", w ? " " : "", (i * 5 + w * 7) % 30);
    src += "\n";
    tgt += "\n";
  }
  return {dir.write("p.src", src), dir.write("p.tgt", tgt)};
}

/// The source and target ids of examples [begin, end) of a dataset.
std::vector<std::vector<int32_t>> fieldOf(const Dataset& d, const std::string& field, size_t begin, size_t end) {
  std::vector<std::vector<int32_t>> out;
  for (size_t i = begin; i < end; ++i) out.push_back(ids(d.example(i).at(field)));
  return out;
}

}  // namespace

TEST_CASE("parallel text scan: the lengths of kept pairs, their counts and a mark every 1024 kept pairs") {
  TempDir dir;
  const auto [src, tgt] = writeParallel(dir, 3000);
  std::map<std::string, int64_t> sourceCounts, targetCounts;
  const ParallelScan scan = scanParallelText(src, tgt, {}, &sourceCounts, &targetCounts);
  const ParallelText whole = loadParallelText(src, tgt);
  REQUIRE(scan.sourceLengths.size() == whole.examples.size());
  CHECK(scan.skipped == whole.skipped);
  CHECK(scan.skipped == 429);  // lines 3, 10, 17, ... of 3000
  for (size_t i = 0; i < whole.examples.size(); ++i) {
    CHECK(scan.sourceLengths[i] + 1 == whole.examples[i].at("source").numel());
    CHECK(scan.targetLengths[i] + 1 == whole.examples[i].at("target_out").numel());
  }
  CHECK(scan.marks.size() == 3);  // kept pairs 0, 1024 and 2048
  CHECK(Vocab::build(sourceCounts, 1, 50000).size() == whole.source.size());
  CHECK(sourceCounts.at("s0") > 0);
  CHECK(static_cast<int32_t>(targetCounts.size()) + kFirstWordId == whole.target.size());
}

TEST_CASE("parallel text ranges: a range read alone is that range of the whole, from any mark") {
  TempDir dir;
  const auto [src, tgt] = writeParallel(dir, 3000);
  const ParallelText whole = loadParallelText(src, tgt);
  const ParallelScan scan = scanParallelText(src, tgt, {}, nullptr, nullptr);
  const size_t kept = scan.sourceLengths.size();
  for (const auto& [begin, end] : std::vector<std::pair<size_t, size_t>>{
           {0, 10}, {1000, 1100}, {1023, 1025}, {2047, kept}, {kept, kept}, {5, 2500}}) {
    CAPTURE(begin);
    CAPTURE(end);
    const PackedPairs range = readPairRange(scan, whole.source, whole.target, begin, end);
    REQUIRE(range.source.size() == end - begin);
    for (size_t i = begin; i < end; ++i) {
      const std::vector<int32_t> source = ids(whole.examples[i].at("source")),
                                 target = ids(whole.examples[i].at("target_out"));
      CHECK(std::vector<int32_t>(range.source[i - begin].begin(), range.source[i - begin].end()) ==
            std::vector<int32_t>(source.begin(), source.end() - 1));  // without </s>
      CHECK(std::vector<int32_t>(range.target[i - begin].begin(), range.target[i - begin].end()) ==
            std::vector<int32_t>(target.begin(), target.end() - 1));
    }
  }
}

TEST_CASE("parallel text streams: a stream is read when its first example is made, and no other") {
  TempDir dir;
  const auto [src, tgt] = writeParallel(dir, 3000);
  const ParallelText whole = loadParallelText(src, tgt);
  auto scan = std::make_shared<const ParallelScan>(scanParallelText(src, tgt, {}, nullptr, nullptr));
  const size_t kept = scan->sourceLengths.size();
  const Dataset streams = translationStreams(scan, whole.source, whole.target, kept, 2);
  CHECK(streams.size() == kept);
  const auto [first, last] = streamRange(0, 2, kept);
  // The target file's last quarter now holds other lines (of 6 words): only stream 1 reads them.
  std::ifstream in(tgt);
  std::string rewritten;
  int line = 0;
  for (std::string text; std::getline(in, text); ++line) rewritten += (line < 2250 ? text : "a b c d e f") + "\n";
  in.close();
  std::ofstream(tgt, std::ios::trunc) << rewritten;
  CHECK(fieldOf(streams, "source", first, last) == fieldOf(whole.examples, "source", first, last));
  CHECK(fieldOf(streams, "target_in", first, last) == fieldOf(whole.examples, "target_in", first, last));
  CHECK(streams.length(last - 1, "target_out") == whole.examples[last - 1].at("target_out").numel());
  const std::string error = errorOf([&] { streams.example(last); });
  CHECK(contains(error, tgt + ":2252: the line has 6 words where the first reading found"));  // 2251: skipped
  CHECK(contains(error, "the file changed while the job ran"));
}

TEST_CASE("parallel text: a side of more than 65535 words is refused, naming the file and line") {
  TempDir dir;
  std::string words;
  for (int i = 0; i < 65536; ++i) words += "a ";
  const std::string src = dir.write("h.src", "ok\n" + words + "\n");
  const std::string tgt = dir.write("h.tgt", "ok\nfine\n");
  CHECK(contains(errorOf([&] { loadParallelText(src, tgt); }),
                 src + ":2: the line has 65536 words, more than the 65535"));
  ParallelTextOptions options;
  options.maxLength = 100;  // skipped instead
  CHECK(loadParallelText(src, tgt, options).skipped == 1);
}
