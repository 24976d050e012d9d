// The synthetic translation task and the parallel-text loader.
#include "data/Translation.h"

#include "core/Error.h"
#include "core/Escape.h"
#include "core/Hash.h"
#include "core/InputFile.h"
#include "core/Random.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <numeric>
#include <tuple>
#include <utility>

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

}  // namespace

Example translationExample(std::span<const int32_t> source, std::span<const int32_t> target) {
  std::vector<int32_t> src(source.begin(), source.end()), in{kBos}, out(target.begin(), target.end());
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

namespace {

/// The two files of parallel text read line by line together, each line's tokens as views.
class PairReader {
 public:
  PairReader(const std::string& sourcePath, const std::string& targetPath)
      : source_(sourcePath, "parallel text", kMaxParallelTextBytes),
        target_(targetPath, "parallel text", kMaxParallelTextBytes) {}

  /// The next pair of lines; false at the end of both files. Files of different line counts are
  /// refused, counting the longer one's lines.
  bool next() {
    const bool more = readTokens(source_, sourceLine_, sourceTokens_);
    if (more == readTokens(target_, targetLine_, targetTokens_)) return more;
    InputFile& longer = more ? source_ : target_;
    std::string& line = more ? sourceLine_ : targetLine_;
    while (longer.readLine(line)) {
    }
    const int64_t shorter = more ? target_.line() : source_.line();
    WEFT_THROW("parallel text: '{}' has {} lines but '{}' has {}; the files must be aligned line by line",
               source_.name(), more ? longer.line() : shorter, target_.name(), more ? shorter : longer.line());
  }
  /// Whether the pair is skipped: an empty side, or one longer than maxLength (> 0).
  bool skipped(int64_t maxLength) const {
    const auto longest = static_cast<int64_t>(std::max(sourceTokens_.size(), targetTokens_.size()));
    return sourceTokens_.empty() || targetTokens_.empty() || (maxLength > 0 && longest > maxLength);
  }
  void seek(const ParallelScan::Mark& mark) {
    source_.seek(mark.sourceOffset, mark.line);
    target_.seek(mark.targetOffset, mark.line);
  }

  InputFile& sourceFile() { return source_; }
  InputFile& targetFile() { return target_; }
  const std::string& sourceLine() const { return sourceLine_; }
  const std::string& targetLine() const { return targetLine_; }
  const std::vector<std::string_view>& sourceTokens() const { return sourceTokens_; }
  const std::vector<std::string_view>& targetTokens() const { return targetTokens_; }

 private:
  InputFile source_, target_;
  std::string sourceLine_, targetLine_;
  std::vector<std::string_view> sourceTokens_, targetTokens_;
};

/// Counts of tokens by id while scanning; added to a map of words at the end.
struct Tally {
  Vocab interned;
  std::vector<int64_t> counts;
  std::vector<int32_t> ids;

  void add(const std::vector<std::string_view>& tokens) {
    interned.addAll(tokens, ids);
    counts.resize(static_cast<size_t>(interned.size()), 0);
    for (const int32_t id : ids) ++counts[static_cast<size_t>(id)];
  }
  void into(std::map<std::string, int64_t>& out) const {
    for (size_t id = 0; id < counts.size(); ++id)
      if (counts[id] > 0) out[interned.word(static_cast<int32_t>(id))] += counts[id];
  }
};

uint64_t hashLine(const std::string& line, uint64_t seed) {
  const uint64_t bytes = line.size();  // so that lines cut elsewhere hash otherwise
  return xxh64(&bytes, sizeof bytes, xxh64(line.data(), line.size(), seed));
}

}  // namespace

ParallelScan scanParallelText(const std::string& sourcePath, const std::string& targetPath,
                              const ParallelTextOptions& options, std::map<std::string, int64_t>* sourceCounts,
                              std::map<std::string, int64_t>* targetCounts) {
  ParallelScan scan;
  scan.sourcePath = sourcePath;
  scan.targetPath = targetPath;
  scan.maxLength = options.maxLength;
  PairReader pairs(sourcePath, targetPath);
  Tally sources, targets;
  for (ParallelScan::Mark at; pairs.next();
       at = {pairs.sourceFile().offset(), pairs.targetFile().offset(), pairs.sourceFile().line()}) {
    scan.textHash = hashLine(pairs.targetLine(), hashLine(pairs.sourceLine(), scan.textHash));
    if (pairs.skipped(options.maxLength)) {
      ++scan.skipped;
      continue;
    }
    for (const auto& [tokens, file] :
         {std::pair{&pairs.sourceTokens(), &pairs.sourceFile()}, std::pair{&pairs.targetTokens(), &pairs.targetFile()}})
      if (tokens->size() > std::numeric_limits<uint16_t>::max())
        file->fail("the line has {} words, more than the 65535 a sentence of parallel text may have", tokens->size());
    if (scan.sourceLengths.size() % ParallelScan::kMarkEvery == 0) scan.marks.push_back(at);
    scan.sourceLengths.push_back(static_cast<uint16_t>(pairs.sourceTokens().size()));
    scan.targetLengths.push_back(static_cast<uint16_t>(pairs.targetTokens().size()));
    if (sourceCounts) sources.add(pairs.sourceTokens());
    if (targetCounts) targets.add(pairs.targetTokens());
  }
  if (sourceCounts) sources.into(*sourceCounts);
  if (targetCounts) targets.into(*targetCounts);
  return scan;
}

PackedPairs readPairRange(const ParallelScan& scan, const Vocab& source, const Vocab& target, size_t begin,
                          size_t end) {
  const size_t kept = scan.sourceLengths.size();
  WEFT_CHECK(begin <= end && end <= kept, "pairs [{}, {}) of parallel text of {}", begin, end, kept);
  PackedPairs out;
  if (begin == end) return out;
  const auto sum = [&](const std::vector<uint16_t>& lengths) {
    return std::accumulate(lengths.begin() + static_cast<std::ptrdiff_t>(begin),
                           lengths.begin() + static_cast<std::ptrdiff_t>(end), size_t{0});
  };
  out.source.reserve(end - begin, sum(scan.sourceLengths));
  out.target.reserve(end - begin, sum(scan.targetLengths));
  PairReader pairs(scan.sourcePath, scan.targetPath);
  pairs.seek(scan.marks[begin / ParallelScan::kMarkEvery]);
  std::vector<int32_t> ids;
  for (size_t next = begin / ParallelScan::kMarkEvery * ParallelScan::kMarkEvery; next < end;) {
    WEFT_CHECK(pairs.next(), "parallel text '{}' ends before its pair {} of {}: it changed while the job ran",
               escapeBytes(scan.sourcePath, 4096), next, kept);
    if (pairs.skipped(scan.maxLength)) continue;
    // A file rewritten since the scan would shift every later pair of the stream.
    for (const auto& [tokens, file, length] :
         {std::tuple{&pairs.sourceTokens(), &pairs.sourceFile(), scan.sourceLengths[next]},
          std::tuple{&pairs.targetTokens(), &pairs.targetFile(), scan.targetLengths[next]}})
      if (tokens->size() != length)
        file->fail(
            "the line has {} words where the first reading found {} for pair {}; the file changed while the "
            "job ran",
            tokens->size(), length, next);
    if (next++ < begin) continue;
    source.ids(pairs.sourceTokens(), ids);
    out.source.add(ids);
    target.ids(pairs.targetTokens(), ids);
    out.target.add(ids);
  }
  return out;
}

ParallelText loadParallelText(const std::string& sourcePath, const std::string& targetPath,
                              const ParallelTextOptions& options) {
  std::map<std::string, int64_t> sourceCounts, targetCounts;
  const ParallelScan scan = scanParallelText(sourcePath, targetPath, options, &sourceCounts, &targetCounts);
  ParallelText text;
  text.source = Vocab::build(sourceCounts, options.minCount, options.maxVocab);
  text.target = Vocab::build(targetCounts, options.minCount, options.maxVocab);
  text.skipped = scan.skipped;
  const PackedPairs pairs = readPairRange(scan, text.source, text.target, 0, scan.sourceLengths.size());
  std::vector<Example> examples;
  examples.reserve(pairs.source.size());
  for (size_t i = 0; i < pairs.source.size(); ++i)
    examples.push_back(translationExample(pairs.source[i], pairs.target[i]));
  text.examples = Dataset(std::move(examples));
  return text;
}

namespace {

/// The streams of a translationStreams dataset, each read when first needed.
class StreamedPairs {
 public:
  StreamedPairs(std::shared_ptr<const ParallelScan> scan, const Vocab& source, const Vocab& target, size_t count,
                int64_t streams)
      : scan_(std::move(scan)),
        source_(source),
        target_(target),
        count_(count),
        loaded_(static_cast<size_t>(streams)),
        held_(static_cast<size_t>(streams)) {}

  Example example(size_t i) {
    const auto streams = static_cast<int64_t>(held_.size());
    const int64_t stream = streamOf(i, streams, count_);
    const auto [first, last] = streamRange(stream, streams, count_);
    const auto s = static_cast<size_t>(stream);
    std::call_once(loaded_[s], [&, first = first, last = last] {
      held_[s] = readPairRange(*scan_, source_, target_, first, last);
    });
    return translationExample(held_[s].source[i - first], held_[s].target[i - first]);
  }

 private:
  std::shared_ptr<const ParallelScan> scan_;
  Vocab source_, target_;
  size_t count_;
  std::vector<std::once_flag> loaded_;
  std::vector<PackedPairs> held_;
};

}  // namespace

Dataset translationStreams(std::shared_ptr<const ParallelScan> scan, const Vocab& source, const Vocab& target,
                           size_t count, int64_t streams) {
  const size_t kept = scan->sourceLengths.size();
  WEFT_CHECK(count >= 1 && count <= kept, "translationStreams: {} pairs of parallel text of {}", count, kept);
  WEFT_CHECK(streams >= 1 && static_cast<size_t>(streams) <= count,
             "translationStreams: {} pairs cannot make {} streams", count, streams);
  const uint64_t layout[] = {count, static_cast<uint64_t>(scan->maxLength)};
  Generator g;
  g.size = count;
  g.identity = xxh64(layout, sizeof layout, target.hash(source.hash(scan->textHash)));
  auto held = std::make_shared<StreamedPairs>(scan, source, target, count, streams);
  g.make = [held](size_t i) { return held->example(i); };
  g.length = [scan](size_t i, const std::string& field) {
    return static_cast<int64_t>(field == "source" ? scan->sourceLengths[i] : scan->targetLengths[i]) + 1;
  };
  return Dataset::generated(std::move(g));
}

}  // namespace weft::data
