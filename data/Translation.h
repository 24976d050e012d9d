// Translation data: a seeded synthetic translation task (source sentences from a
// SyntheticLanguage, targets by a fixed reordering and word mapping) and a loader of aligned
// tokenised parallel text (WMT style). Both give examples for a Batcher with
// padded = {"source", "target_in", "target_out"}:
//
//     "source"     i32 [n]: w1 .. wn </s>
//     "target_in"  i32 [m]: <s> y1 .. ym
//     "target_out" i32 [m]: y1 .. ym </s>
#pragma once

#include "data/Dataset.h"
#include "data/SyntheticLanguage.h"
#include "data/TextCorpus.h"
#include "data/Vocab.h"

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace weft::data {

/// The example fields above from a source and a target sentence (word ids, no specials).
Example translationExample(std::span<const int32_t> source, std::span<const int32_t> target);

struct TranslationSpec {
  /// A small language with short sentences, so a model trains in minutes.
  LanguageSpec language{.vocab = 2000, .classes = 64, .successors = 4, .zipf = 1.2, .meanLength = 8,
                        .maxLength = 12, .seed = 1};
  int64_t minLength = 4;  // shorter sentences of the language are skipped
  uint64_t seed = 1;      // fixes the word mapping
};

/// The synthetic task. The target of source w1 .. wn is built in two steps:
///   1. reorder: swap each adjacent pair (w2 w1 w4 w3 ...; an odd last word stays last);
///   2. map: replace each word w by m(w), a fixed seeded bijection of the word ids [4, 4 + vocab).
/// Sentence i is the first sentence of the language's stream among indices
/// [64 i, 64 i + 64) whose length is at least minLength, so different i give different draws.
class TranslationTask {
 public:
  explicit TranslationTask(TranslationSpec spec);

  std::vector<int32_t> source(uint64_t index) const;
  /// The target of a source sentence under the task's rule.
  std::vector<int32_t> translate(const std::vector<int32_t>& source) const;
  /// m(word) for a word id.
  int32_t mapWord(int32_t word) const;
  /// Examples for sentences [begin, end).
  Dataset examples(uint64_t begin, uint64_t end) const;

  /// Ids in each language, specials included (targets use the same id range as sources).
  int32_t vocabSize() const { return static_cast<int32_t>(mapping_.size()); }
  const TranslationSpec& spec() const { return spec_; }

 private:
  TranslationSpec spec_;
  SyntheticLanguage language_;
  std::vector<int32_t> mapping_;  // by source id; specials map to themselves
};

/// The largest file of parallel text read (each side).
inline constexpr uint64_t kMaxParallelTextBytes = uint64_t{16} << 30;

struct ParallelTextOptions {
  int64_t minCount = 1;     // words seen fewer times become <unk>
  int64_t maxVocab = 50000; // ids per language, specials included
  int64_t maxLength = 0;    // pairs with a longer side are skipped; 0: no limit
};

struct ParallelText {
  Vocab source, target;
  Dataset examples;
  int64_t skipped = 0;  // pairs left out: an empty side, or longer than maxLength
};

/// Reads two aligned files, one sentence per line, tokens separated by whitespace (a trailing
/// '\r' is dropped). A pair with an empty (or all-whitespace) side is skipped and counted in
/// `skipped`, since it carries nothing to learn. Throws naming the file (and line, and byte within
/// it) when a file is missing or unreadable, the two files have different line counts, a line
/// is not valid UTF-8 or longer than kMaxLineBytes, or a kept side has more than 65535 words.
/// Only regular files of at most kMaxParallelTextBytes are read (core/InputFile.h).
ParallelText loadParallelText(const std::string& sourcePath, const std::string& targetPath,
                              const ParallelTextOptions& options = {});

/// What one reading of two aligned files learns without holding their words: the lengths of
/// every kept pair's sides and where every kMarkEvery-th kept pair's lines start. A process that
/// reads and holds only some pairs (readPairRange) still knows every pair's lengths, which a
/// batch's padding widths and token count need (a pair costs 4 bytes here, 4 a word held).
struct ParallelScan {
  static constexpr size_t kMarkEvery = 1024;
  /// Where kept pair i * kMarkEvery's lines start: their byte offsets, and the lines before them.
  struct Mark {
    uint64_t sourceOffset = 0, targetOffset = 0;
    int64_t line = 0;
  };
  std::string sourcePath, targetPath;
  int64_t maxLength = 0;                               ///< ParallelTextOptions::maxLength
  std::vector<uint16_t> sourceLengths, targetLengths;  ///< words of each kept pair's sides
  std::vector<Mark> marks;
  int64_t skipped = 0;
  uint64_t textHash = 0;  ///< XXH64 of both files' lines in order
};

/// Reads both files once, line by line together (errors as loadParallelText's), adding the
/// tokens of each kept pair's sides to `sourceCounts` and `targetCounts` when they are not null.
ParallelScan scanParallelText(const std::string& sourcePath, const std::string& targetPath,
                              const ParallelTextOptions& options, std::map<std::string, int64_t>* sourceCounts,
                              std::map<std::string, int64_t>* targetCounts);

/// Kept pairs [begin, end) of a scan as ids of the vocabularies (unknown words become kUnk):
/// only the lines from the mark before `begin` on are read. Throws naming the file when its
/// lines are no longer those the scan found.
struct PackedPairs {
  PackedSentences source, target;
};
PackedPairs readPairRange(const ParallelScan& scan, const Vocab& source, const Vocab& target, size_t begin, size_t end);

/// Translation examples of kept pairs [0, count) of a scan, in `streams` streams of consecutive
/// pairs as BatchOptions::streams cuts them: a stream's pairs are read and held when the first
/// of its examples is made, so a data-parallel worker reading its part of each batch reads and
/// holds its streams only. Lengths come from the scan.
Dataset translationStreams(std::shared_ptr<const ParallelScan> scan, const Vocab& source, const Vocab& target,
                           size_t count, int64_t streams);

}  // namespace weft::data
