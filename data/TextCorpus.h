// Plain-text corpora with one sentence per line (1B-Word / PTB style), tokenised on whitespace:
// token counts, vocabulary construction, lines as id sequences (packed for corpora of billions of
// words, read from one file or a directory of shards), pre-tokenised id files, and the examples
// a language model trains on.
//
//     TextCorpus c = loadTextCorpus("train.txt", /*minCount=*/3, /*maxVocab=*/100000);
//     Dataset lm = lmDataset(c.sentences);   // Batcher with .padded = {"tokens", "targets"}
#pragma once

#include "data/Dataset.h"
#include "data/Vocab.h"

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace weft::data {

/// The largest text file (corpus or id file) read; larger files are refused when opened.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{16} << 30;

struct TextCorpus {
  Vocab vocab;
  std::vector<std::vector<int32_t>> sentences;  // word ids of each non-empty line, no <s> / </s>
};

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
  void add(std::span<const int32_t> words);
  size_t size() const { return offsets_.size() - 1; }
  std::span<const int32_t> operator[](size_t i) const {
    return {ids_.data() + offsets_[i], static_cast<size_t>(offsets_[i + 1] - offsets_[i])};
  }
  /// Words in all sentences.
  size_t words() const { return ids_.size(); }
  /// XXH64 of the ids and the sentence boundaries.
  uint64_t hash() const;

 private:
  std::vector<int32_t> ids_;
  std::vector<int64_t> offsets_{0};
};

/// Token counts over every file.
std::map<std::string, int64_t> countTokens(const std::vector<std::string>& files);
/// The non-empty lines of the files, in order, as ids of `vocab` (unknown words become kUnk),
/// each cut to its first maxLength words.
PackedSentences readPackedSentences(const std::vector<std::string>& files, const Vocab& vocab, int64_t maxLength);

/// <s> w1 .. wn </s>.
std::vector<int32_t> withBoundaries(const std::vector<int32_t>& words);

/// A language-model example of a sentence w1..wn: "tokens" i32 [n+1] (<s> w1..wn) and
/// "targets" i32 [n+1] (w1..wn </s>).
Example lmExample(std::span<const int32_t> words);
Dataset lmDataset(const std::vector<std::vector<int32_t>>& sentences);
/// Sentences [first, first + count) of `sentences` as language-model examples, made when read
/// (Dataset::generated): nothing but the packed ids is held.
Dataset lmDataset(std::shared_ptr<const PackedSentences> sentences, size_t first, size_t count);

}  // namespace weft::data
