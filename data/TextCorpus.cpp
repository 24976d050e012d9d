// TextCorpus: line-by-line reading with file:line errors, and the conversions from lines to ids
// to language-model examples.
#include "data/TextCorpus.h"

#include "core/Error.h"
#include "core/Escape.h"
#include "core/Hash.h"
#include "core/InputFile.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <functional>

namespace weft::data {
namespace {

/// Calls fn(tokens, in) for every line; checks UTF-8 and names the file and line.
void forEachLine(const std::string& path, const std::function<void(const std::vector<std::string>&, InputFile&)>& fn) {
  InputFile in(path, "text corpus", kMaxTextFileBytes);
  std::string line;
  std::vector<std::string> tokens;
  while (in.readLine(line)) {
    const int64_t bad = invalidUtf8Offset(line);
    if (bad >= 0) in.fail("invalid UTF-8 at byte {} of the line", bad);
    tokens.clear();
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      const size_t begin = i;
      while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      if (i > begin) tokens.emplace_back(line, begin, i - begin);
    }
    fn(tokens, in);
  }
}

}  // namespace

std::map<std::string, int64_t> countTokens(const std::string& path) {
  std::map<std::string, int64_t> counts;
  forEachLine(path, [&](const std::vector<std::string>& tokens, InputFile&) {
    for (const auto& t : tokens) ++counts[t];
  });
  return counts;
}

std::vector<std::vector<int32_t>> readSentences(const std::string& path, const Vocab& vocab) {
  std::vector<std::vector<int32_t>> sentences;
  forEachLine(path, [&](const std::vector<std::string>& tokens, InputFile&) {
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
  forEachLine(path, [&](const std::vector<std::string>& tokens, InputFile& in) {
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

void PackedSentences::add(std::span<const int32_t> words) {
  ids_.insert(ids_.end(), words.begin(), words.end());
  offsets_.push_back(static_cast<int64_t>(ids_.size()));
}

uint64_t PackedSentences::hash() const {
  return xxh64(offsets_.data(), offsets_.size() * sizeof(int64_t),
               xxh64(ids_.data(), ids_.size() * sizeof(int32_t), 0));
}

std::map<std::string, int64_t> countTokens(const std::vector<std::string>& files) {
  std::map<std::string, int64_t> counts;
  for (const std::string& file : files) {
    forEachLine(file, [&](const std::vector<std::string>& tokens, InputFile&) {
      for (const auto& t : tokens) ++counts[t];
    });
  }
  return counts;
}

PackedSentences readPackedSentences(const std::vector<std::string>& files, const Vocab& vocab, int64_t maxLength) {
  WEFT_CHECK(maxLength >= 1, "readPackedSentences: maxLength is {}; it must be >= 1", maxLength);
  PackedSentences sentences;
  std::vector<int32_t> ids;
  for (const std::string& file : files) {
    forEachLine(file, [&](const std::vector<std::string>& tokens, InputFile&) {
      if (tokens.empty()) return;
      ids.clear();
      for (size_t i = 0; i < tokens.size() && static_cast<int64_t>(i) < maxLength; ++i)
        ids.push_back(vocab.id(tokens[i]));
      sentences.add(ids);
    });
  }
  return sentences;
}

Dataset lmDataset(std::shared_ptr<const PackedSentences> sentences, size_t first, size_t count) {
  WEFT_CHECK(first + count <= sentences->size(), "lmDataset: sentences [{}, {}) of {}", first, first + count,
             sentences->size());
  const uint64_t range[] = {first, count};
  Generator g;
  g.size = count;
  g.identity = xxh64(range, sizeof range, sentences->hash());
  g.make = [sentences, first](size_t i) { return lmExample((*sentences)[first + i]); };
  // tokens (<s> and the words) and targets (the words and </s>) are one longer than the sentence.
  g.length = [sentences, first](size_t i, const std::string&) {
    return static_cast<int64_t>((*sentences)[first + i].size()) + 1;
  };
  return Dataset::generated(std::move(g));
}

}  // namespace weft::data
