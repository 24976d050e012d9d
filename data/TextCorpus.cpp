// TextCorpus: line-by-line reading with file:line errors, and the conversions from lines to ids
// to language-model examples.
#include "data/TextCorpus.h"

#include "core/Error.h"
#include "core/Escape.h"
#include "core/Hash.h"
#include "core/InputFile.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <functional>
#include <limits>
#include <mutex>
#include <numeric>
#include <string_view>

namespace weft::data {
namespace {

/// std::isspace in the "C" locale, inlined: the tokenizer asks it of every byte of a corpus.
bool isSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/// Calls fn(tokens, in) for every line; checks UTF-8 and names the file and line.
void forEachLine(const std::string& path,
                 const std::function<void(const std::vector<std::string_view>&, InputFile&)>& fn) {
  InputFile in(path, "text corpus", kMaxTextFileBytes);
  std::string line;
  std::vector<std::string_view> tokens;
  while (readTokens(in, line, tokens)) fn(tokens, in);
}

}  // namespace

bool readTokens(InputFile& in, std::string& line, std::vector<std::string_view>& tokens) {
  if (!in.readLine(line)) return false;
  const int64_t bad = invalidUtf8Offset(line);
  if (bad >= 0) in.fail("invalid UTF-8 at byte {} of the line", bad);
  tokens.clear();
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && isSpace(line[i])) ++i;
    const size_t begin = i;
    while (i < line.size() && !isSpace(line[i])) ++i;
    if (i > begin) tokens.emplace_back(line.data() + begin, i - begin);
  }
  return true;
}

std::map<std::string, int64_t> countTokens(const std::string& path) {
  std::map<std::string, int64_t> counts;
  scanCorpus({path}, std::numeric_limits<uint16_t>::max(), &counts);  // counts by interning, the fast way
  return counts;
}

std::vector<std::vector<int32_t>> readSentences(const std::string& path, const Vocab& vocab) {
  std::vector<std::vector<int32_t>> sentences;
  forEachLine(path, [&](const std::vector<std::string_view>& tokens, InputFile&) {
    if (tokens.empty()) return;
    std::vector<int32_t> ids;
    ids.reserve(tokens.size());
    for (const auto& t : tokens) ids.push_back(vocab.id(t));
    sentences.push_back(std::move(ids));
  });
  return sentences;
}

TextCorpus loadTextCorpus(const std::string& path, int64_t minCount, int64_t maxVocab) {
  TextCorpus c;
  c.vocab = Vocab::build(countTokens(path), minCount, maxVocab);
  c.sentences = readSentences(path, c.vocab);
  return c;
}

std::vector<std::vector<int32_t>> readIdFile(const std::string& path, int32_t vocabSize) {
  std::vector<std::vector<int32_t>> sentences;
  forEachLine(path, [&](const std::vector<std::string_view>& tokens, InputFile& in) {
    if (tokens.empty()) return;
    std::vector<int32_t> ids;
    for (const auto& t : tokens) {
      int64_t id = 0;
      const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), id);
      if (ec != std::errc() || end != t.data() + t.size()) in.fail("'{}' is not an id", escapeBytes(t));
      if (id < 0 || id >= vocabSize) in.fail("id {} is outside the vocabulary of {} ids", id, vocabSize);
      ids.push_back(static_cast<int32_t>(id));
    }
    sentences.push_back(std::move(ids));
  });
  return sentences;
}

std::vector<int32_t> withBoundaries(const std::vector<int32_t>& words) {
  std::vector<int32_t> out;
  out.reserve(words.size() + 2);
  out.push_back(kBos);
  out.insert(out.end(), words.begin(), words.end());
  out.push_back(kEos);
  return out;
}

Example lmExample(std::span<const int32_t> words) {
  const auto n = static_cast<int64_t>(words.size()) + 1;
  std::vector<int32_t> tokens{kBos}, targets(words.begin(), words.end());
  tokens.insert(tokens.end(), words.begin(), words.end());
  targets.push_back(kEos);
  return {{"tokens", Tensor::fromVector(tokens, {n})}, {"targets", Tensor::fromVector(targets, {n})}};
}

Dataset lmDataset(const std::vector<std::vector<int32_t>>& sentences) {
  std::vector<Example> examples;
  examples.reserve(sentences.size());
  for (const auto& s : sentences) examples.push_back(lmExample(s));
  return Dataset(std::move(examples));
}

std::vector<std::string> corpusFiles(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) return {path};  // InputFile names what is wrong with it
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (entry.is_regular_file()) files.push_back(entry.path().string());
  }
  WEFT_CHECK(!files.empty(), "text corpus directory {} holds no files", path);
  std::sort(files.begin(), files.end());
  return files;
}

void PackedSentences::reserve(size_t sentences, size_t words) {
  ids_.reserve(ids_.size() + words);
  offsets_.reserve(offsets_.size() + sentences);
}

void PackedSentences::add(std::span<const int32_t> words) {
  ids_.insert(ids_.end(), words.begin(), words.end());
  offsets_.push_back(static_cast<int64_t>(ids_.size()));
}

PackedSentences readPackedSentences(const std::vector<std::string>& files, const Vocab& vocab, int64_t maxLength) {
  WEFT_CHECK(maxLength >= 1, "readPackedSentences: maxLength is {}; it must be >= 1", maxLength);
  PackedSentences sentences;
  std::vector<int32_t> ids;
  for (const std::string& file : files) {
    forEachLine(file, [&](const std::vector<std::string_view>& tokens, InputFile&) {
      if (tokens.empty()) return;
      vocab.ids(std::span(tokens).first(std::min(tokens.size(), static_cast<size_t>(maxLength))), ids);
      sentences.add(ids);
    });
  }
  return sentences;
}

CorpusScan scanCorpus(const std::vector<std::string>& files, int64_t maxLength,
                      std::map<std::string, int64_t>* counts) {
  WEFT_CHECK(maxLength >= 1 && maxLength <= std::numeric_limits<uint16_t>::max(),
             "a text corpus's sentences are cut to 1 to 65535 words, not {}", maxLength);
  CorpusScan scan;
  scan.files = files;
  scan.maxLength = maxLength;
  // Each token is interned while scanning (its count kept by its interned id), ordered at the end.
  Vocab interned;
  std::vector<int64_t> tally(static_cast<size_t>(interned.size()), 0);
  std::vector<int32_t> ids;
  std::string line;
  std::vector<std::string_view> tokens;
  for (size_t f = 0; f < files.size(); ++f) {
    InputFile in(files[f], "text corpus", kMaxTextFileBytes);
    for (uint64_t start = 0; readTokens(in, line, tokens); start = in.offset()) {
      const uint64_t bytes = line.size();  // so that lines cut elsewhere hash otherwise
      scan.textHash = xxh64(&bytes, sizeof bytes, xxh64(line.data(), line.size(), scan.textHash));
      if (counts) {
        interned.addAll(tokens, ids);
        tally.resize(static_cast<size_t>(interned.size()), 0);
        for (const int32_t id : ids) ++tally[static_cast<size_t>(id)];
      }
      if (tokens.empty()) continue;
      if (scan.lengths.size() % CorpusScan::kMarkEvery == 0) scan.marks.push_back({f, start, in.line() - 1});
      scan.lengths.push_back(static_cast<uint16_t>(std::min<int64_t>(maxLength, static_cast<int64_t>(tokens.size()))));
    }
  }
  for (size_t id = 0; id < tally.size(); ++id)
    if (tally[id] > 0) (*counts)[interned.word(static_cast<int32_t>(id))] += tally[id];
  return scan;
}

PackedSentences readSentenceRange(const CorpusScan& scan, const Vocab& vocab, size_t begin, size_t end) {
  WEFT_CHECK(begin <= end && end <= scan.lengths.size(), "sentences [{}, {}) of a text corpus of {}", begin, end,
             scan.lengths.size());
  PackedSentences sentences;
  if (begin == end) return sentences;
  sentences.reserve(end - begin, std::accumulate(scan.lengths.begin() + static_cast<std::ptrdiff_t>(begin),
                                                 scan.lengths.begin() + static_cast<std::ptrdiff_t>(end), size_t{0}));
  const CorpusScan::Mark& mark = scan.marks[begin / CorpusScan::kMarkEvery];
  size_t next = begin / CorpusScan::kMarkEvery * CorpusScan::kMarkEvery;  // the sentence the mark starts
  std::string line;
  std::vector<std::string_view> tokens;
  std::vector<int32_t> ids;
  size_t f = mark.file;
  for (; f < scan.files.size() && next < end; ++f) {
    InputFile in(scan.files[f], "text corpus", kMaxTextFileBytes);
    if (f == mark.file) in.seek(mark.offset, mark.line);
    while (next < end && readTokens(in, line, tokens)) {
      if (tokens.empty()) continue;
      const auto words = std::min<size_t>(tokens.size(), static_cast<size_t>(scan.maxLength));
      // A file rewritten since the scan would shift every later sentence of the stream.
      if (words != scan.lengths[next])
        in.fail(
            "the line has {} words (cut to --max-length {}: {}) where the corpus's first reading found {} "
            "for sentence {}; this file, or one before it, changed while the job ran",
            tokens.size(), scan.maxLength, words, scan.lengths[next], next);
      if (next++ < begin) continue;
      vocab.ids(std::span(tokens).first(words), ids);
      sentences.add(ids);
    }
  }
  WEFT_CHECK(next == end,
             "text corpus {} ended {} sentences before the corpus's first reading did; it changed while "
             "the job ran",
             escapeBytes(scan.files[f - 1]), end - next);
  return sentences;
}

namespace {

/// The streams of an lmStreams dataset, each read when first needed.
class StreamedSentences {
 public:
  StreamedSentences(std::shared_ptr<const CorpusScan> scan, const Vocab& vocab, size_t count, int64_t streams)
      : scan_(std::move(scan)),
        vocab_(vocab),
        count_(count),
        loaded_(static_cast<size_t>(streams)),
        held_(static_cast<size_t>(streams)) {}

  std::span<const int32_t> sentence(size_t i) {
    const auto streams = static_cast<int64_t>(held_.size());
    const int64_t stream = streamOf(i, streams, count_);
    const auto [first, last] = streamRange(stream, streams, count_);
    const auto s = static_cast<size_t>(stream);
    std::call_once(loaded_[s],
                   [&, first = first, last = last] { held_[s] = readSentenceRange(*scan_, vocab_, first, last); });
    return held_[s][i - first];
  }

 private:
  std::shared_ptr<const CorpusScan> scan_;
  Vocab vocab_;
  size_t count_;
  std::vector<std::once_flag> loaded_;
  std::vector<PackedSentences> held_;
};

}  // namespace

Dataset lmStreams(std::shared_ptr<const CorpusScan> scan, const Vocab& vocab, size_t count, int64_t streams) {
  WEFT_CHECK(count >= 1 && count <= scan->lengths.size(), "lmStreams: {} sentences of a text corpus of {}", count,
             scan->lengths.size());
  WEFT_CHECK(streams >= 1 && static_cast<size_t>(streams) <= count, "lmStreams: {} sentences cannot make {} streams",
             count, streams);
  const uint64_t layout[] = {count, static_cast<uint64_t>(scan->maxLength)};
  Generator g;
  g.size = count;
  g.identity = xxh64(layout, sizeof layout, vocab.hash(scan->textHash));
  auto held = std::make_shared<StreamedSentences>(scan, vocab, count, streams);
  g.make = [held](size_t i) { return lmExample(held->sentence(i)); };
  g.length = [scan](size_t i, const std::string&) { return static_cast<int64_t>(scan->lengths[i]) + 1; };
  return Dataset::generated(std::move(g));
}

}  // namespace weft::data
