// Plain-text corpora with one sentence per line (1B-Word / PTB style), tokenised on whitespace:
// token counts, vocabulary construction, lines as id sequences (packed for corpora of billions of
// words, read from one file or a directory of shards, whole or a range of sentences at a time),
// pre-tokenised id files, and the examples a language model trains on.
//
//     TextCorpus c = loadTextCorpus("train.txt", /*minCount=*/3, /*maxVocab=*/100000);
//     Dataset lm = lmDataset(c.sentences);   // Batcher with .padded = {"tokens", "targets"}
//
//     std::map<std::string, int64_t> counts;   // a corpus larger than one worker's memory
//     auto scan = std::make_shared<const CorpusScan>(scanCorpus(corpusFiles(dir), 100, &counts));
//     Dataset streams = lmStreams(scan, Vocab::build(counts, 3, 100000), scan->lengths.size(), 8);
#pragma once

#include "core/InputFile.h"
#include "data/Dataset.h"
#include "data/Vocab.h"

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weft::data {

/// The largest text file (corpus or id file) read; larger files are refused when opened.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{16} << 30;

struct TextCorpus {
  Vocab vocab;
  std::vector<std::vector<int32_t>> sentences;  // word ids of each non-empty line, no <s> / </s>
};

/// Reads the next line of `in` into `line` and its whitespace-separated words into `tokens` (views
/// of `line`); false at the end of the file. Checks UTF-8, naming the file and line.
bool readTokens(InputFile& in, std::string& line, std::vector<std::string_view>& tokens);

/// Whitespace-separated tokens of every line of a text file. Errors name the file and line
/// (missing file, invalid UTF-8 with its byte offset in the line, a line over kMaxLineBytes).
/// Only a regular file of at most kMaxTextFileBytes is read (core/InputFile.h).
std::map<std::string, int64_t> countTokens(const std::string& path);
/// The words of each non-empty line as ids of `vocab` (unknown words become kUnk).
std::vector<std::vector<int32_t>> readSentences(const std::string& path, const Vocab& vocab);
/// Counts tokens, builds a Vocab (Vocab::build's minCount and maxSize) and reads the sentences.
TextCorpus loadTextCorpus(const std::string& path, int64_t minCount, int64_t maxVocab);

/// Pre-tokenised sentences: one per line, decimal ids separated by whitespace. Errors name the
/// file and line of a malformed number or an id outside [0, vocabSize).
std::vector<std::vector<int32_t>> readIdFile(const std::string& path, int32_t vocabSize);

/// The files of a corpus: `path` itself, or a directory's regular files sorted by name (1B-Word's
/// training-monolingual.tokenized.shuffled/ holds 99 shards). A directory without files, or a
/// path that does not exist, is an error naming it.
std::vector<std::string> corpusFiles(const std::string& path);

/// Sentences as word ids, packed into one array: a corpus of 30 million sentences would spend
/// more on a vector per sentence (its header and allocation) than on its words.
class PackedSentences {
 public:
  /// Room for `sentences` more sentences of `words` words in all, so a large read grows no array.
  void reserve(size_t sentences, size_t words);
  void add(std::span<const int32_t> words);
  size_t size() const { return offsets_.size() - 1; }
  std::span<const int32_t> operator[](size_t i) const {
    return {ids_.data() + offsets_[i], static_cast<size_t>(offsets_[i + 1] - offsets_[i])};
  }
  /// Words in all sentences.
  size_t words() const { return ids_.size(); }

 private:
  std::vector<int32_t> ids_;
  std::vector<int64_t> offsets_{0};
};

/// The non-empty lines of the files, in order, as ids of `vocab` (unknown words become kUnk),
/// each cut to its first maxLength words.
PackedSentences readPackedSentences(const std::vector<std::string>& files, const Vocab& vocab, int64_t maxLength);

/// What one reading of a corpus's files learns without holding its words: the length of every
/// non-empty line and where every kMarkEvery-th of them starts. A process that reads and holds
/// only some of the sentences (readSentenceRange) still knows every sentence's length, which a
/// batch's padding widths and word count need (a sentence costs 2 bytes here, 4 a word held).
struct CorpusScan {
  static constexpr size_t kMarkEvery = 1024;
  /// Where sentence i * kMarkEvery's line starts: file, byte offset, lines before it in the file.
  struct Mark {
    size_t file = 0;
    uint64_t offset = 0;
    int64_t line = 0;
  };
  std::vector<std::string> files;
  int64_t maxLength = 0;
  std::vector<uint16_t> lengths;  // words of each non-empty line, cut to maxLength
  std::vector<Mark> marks;
  uint64_t textHash = 0;  // XXH64 of the lines in order
};

/// Reads every file once (UTF-8 checked, errors naming file and line) and adds each token's count
/// to `counts` when it is not null. maxLength is 1 to 65535.
CorpusScan scanCorpus(const std::vector<std::string>& files, int64_t maxLength,
                      std::map<std::string, int64_t>* counts = nullptr);

/// Sentences [begin, end) of a scanned corpus as ids of `vocab` (unknown words become kUnk), each
/// cut to maxLength words: only the files they lie in are read, from the mark before `begin`.
/// Throws naming the file when its lines are no longer those the scan found.
PackedSentences readSentenceRange(const CorpusScan& scan, const Vocab& vocab, size_t begin, size_t end);

/// Language-model examples of sentences [0, count) of a scanned corpus, in `streams` streams of
/// consecutive sentences as BatchOptions::streams cuts them (streamRange). A stream's sentences
/// are read from the files, and held, when the first of its examples is made: a process that
/// makes the examples of some streams only (a data-parallel worker reading its part of each
/// batch) reads and holds those streams only. Lengths come from the scan.
Dataset lmStreams(std::shared_ptr<const CorpusScan> scan, const Vocab& vocab, size_t count, int64_t streams);

/// <s> w1 .. wn </s>.
std::vector<int32_t> withBoundaries(const std::vector<int32_t>& words);

/// A language-model example of a sentence w1..wn: "tokens" i32 [n+1] (<s> w1..wn) and
/// "targets" i32 [n+1] (w1..wn </s>).
Example lmExample(std::span<const int32_t> words);
Dataset lmDataset(const std::vector<std::vector<int32_t>>& sentences);

}  // namespace weft::data
