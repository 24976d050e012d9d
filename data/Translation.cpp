// The synthetic translation task and the parallel-text loader.
#include "data/Translation.h"

#include "core/Error.h"
#include "core/Escape.h"
#include "core/InputFile.h"
#include "core/Random.h"

#include <algorithm>
#include <numeric>
#include <sstream>

namespace weft::data {
namespace {

/// Candidate stream sentences per task sentence; running out needs minLength far above the
/// language's mean length.
constexpr uint64_t kDrawsPerSentence = 64;

Tensor idTensor(const std::vector<int32_t>& ids) {
  return Tensor::fromVector(ids, {static_cast<int64_t>(ids.size())});
}

/// A seeded permutation of the word ids [kFirstWordId, size); specials map to themselves.
std::vector<int32_t> wordMapping(int32_t size, uint64_t seed) {
  std::vector<int32_t> mapping(static_cast<size_t>(size));
  std::iota(mapping.begin(), mapping.end(), 0);
  const uint64_t key = streamKey(seed, "translation/mapping");
  // Fisher-Yates over the word ids only.
  for (int32_t i = size - 1; i > kFirstWordId; --i) {
    const auto span = static_cast<double>(i - kFirstWordId + 1);
    const auto j = kFirstWordId + static_cast<int32_t>(uniformAt(key, static_cast<uint64_t>(i)) * span);
    std::swap(mapping[static_cast<size_t>(i)], mapping[static_cast<size_t>(j)]);
  }
  return mapping;
}

/// The lines of a text file, without line terminators ('\n', and a '\r' before it).
std::vector<std::string> readLines(const std::string& path) {
  InputFile in(path, "parallel text", kMaxParallelTextBytes);
  std::vector<std::string> lines;
  std::string line;
  while (in.readLine(line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const int64_t bad = invalidUtf8Offset(line);
    if (bad >= 0) in.fail("invalid UTF-8 at byte {} of the line", bad);
    lines.push_back(std::move(line));
  }
  return lines;
}

std::vector<std::string> tokens(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string t; in >> t;) out.push_back(std::move(t));
  return out;
}

Vocab vocabOf(const std::vector<std::vector<std::string>>& sentences, const ParallelTextOptions& options) {
  std::map<std::string, int64_t> counts;
  for (const auto& s : sentences) {
    for (const auto& t : s) ++counts[t];
  }
  return Vocab::build(counts, options.minCount, options.maxVocab);
}

std::vector<int32_t> idsOf(const Vocab& vocab, const std::vector<std::string>& words) {
  std::vector<int32_t> ids;
  ids.reserve(words.size());
  for (const auto& w : words) ids.push_back(vocab.id(w));
  return ids;
}

}  // namespace

Example translationExample(const std::vector<int32_t>& source, const std::vector<int32_t>& target) {
  std::vector<int32_t> src = source, in{kBos}, out = target;
  src.push_back(kEos);
  in.insert(in.end(), target.begin(), target.end());
  out.push_back(kEos);
  return {{"source", idTensor(src)}, {"target_in", idTensor(in)}, {"target_out", idTensor(out)}};
}

TranslationTask::TranslationTask(TranslationSpec spec)
    : spec_(spec), language_(spec.language),
      mapping_(wordMapping(static_cast<int32_t>(spec.language.vocab) + kFirstWordId, spec.seed)) {
  WEFT_CHECK(spec.minLength >= 1 && spec.minLength <= spec.language.maxLength,
             "TranslationTask: minLength {} must be in [1, the language's maxLength {}]", spec.minLength,
             spec.language.maxLength);
}

std::vector<int32_t> TranslationTask::source(uint64_t index) const {
  for (uint64_t k = 0; k < kDrawsPerSentence; ++k) {
    std::vector<int32_t> s = language_.sentence(index * kDrawsPerSentence + k);
    if (static_cast<int64_t>(s.size()) >= spec_.minLength) return s;
  }
  WEFT_THROW("TranslationTask: none of {} draws for sentence {} has minLength {} words (mean length {})",
             kDrawsPerSentence, index, spec_.minLength, spec_.language.meanLength);
}

int32_t TranslationTask::mapWord(int32_t word) const {
  WEFT_CHECK(word >= 0 && word < vocabSize(), "TranslationTask: word id {} outside [0, {})", word, vocabSize());
  return mapping_[static_cast<size_t>(word)];
}

std::vector<int32_t> TranslationTask::translate(const std::vector<int32_t>& source) const {
  std::vector<int32_t> target = source;
  for (size_t i = 0; i + 1 < target.size(); i += 2) std::swap(target[i], target[i + 1]);
  for (int32_t& w : target) w = mapWord(w);
  return target;
}

Dataset TranslationTask::examples(uint64_t begin, uint64_t end) const {
  std::vector<Example> out;
  out.reserve(end > begin ? end - begin : 0);
  for (uint64_t i = begin; i < end; ++i) {
    const std::vector<int32_t> s = source(i);
    out.push_back(translationExample(s, translate(s)));
  }
  return Dataset(std::move(out));
}

ParallelText loadParallelText(const std::string& sourcePath, const std::string& targetPath,
                              const ParallelTextOptions& options) {
  const std::vector<std::string> sourceLines = readLines(sourcePath), targetLines = readLines(targetPath);
  WEFT_CHECK(sourceLines.size() == targetLines.size(),
             "parallel text: '{}' has {} lines but '{}' has {}; the files must be aligned line by line",
             escapeBytes(sourcePath, 4096), sourceLines.size(), escapeBytes(targetPath, 4096), targetLines.size());
  std::vector<std::vector<std::string>> sources, targets;
  ParallelText text;
  for (size_t i = 0; i < sourceLines.size(); ++i) {
    std::vector<std::string> s = tokens(sourceLines[i]), t = tokens(targetLines[i]);
    const auto longest = static_cast<int64_t>(std::max(s.size(), t.size()));
    if (s.empty() || t.empty() || (options.maxLength > 0 && longest > options.maxLength)) {
      ++text.skipped;
      continue;
    }
    sources.push_back(std::move(s));
    targets.push_back(std::move(t));
  }
  text.source = vocabOf(sources, options);
  text.target = vocabOf(targets, options);
  std::vector<Example> examples;
  examples.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    examples.push_back(translationExample(idsOf(text.source, sources[i]), idsOf(text.target, targets[i])));
  }
  text.examples = Dataset(std::move(examples));
  return text;
}

}  // namespace weft::data
