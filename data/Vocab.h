// A word <-> id mapping for language data, with four reserved ids (padding, unknown word,
// sentence start and end) and a one-word-per-line file format.
#pragma once

#include "core/Hash.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace weft::data {

/// Special ids; words start at 4.
inline constexpr int32_t kPad = 0, kUnk = 1, kBos = 2, kEos = 3;
inline constexpr int32_t kFirstWordId = 4;
/// The largest vocabulary file Vocab::load reads.
inline constexpr uint64_t kMaxVocabFileBytes = uint64_t{1} << 30;

/// Words by id and ids by word.
///
///     Vocab v = Vocab::build(counts, /*minCount=*/2, /*maxSize=*/50000);
///     int32_t id = v.id("the");   // kUnk when unknown
class Vocab {
 public:
  /// Just the 4 specials: "<pad>", "<unk>", "<s>", "</s>".
  Vocab();

  /// The id of `word`, adding it if new.
  int32_t add(const std::string& word);
  /// The id of `word`, or kUnk when unknown.
  int32_t id(std::string_view word) const;
  /// The word of `id`; throws naming the id when out of range.
  const std::string& word(int32_t id) const;
  int32_t size() const { return static_cast<int32_t>(words_.size()); }

  /// From token counts: words with count >= minCount, most frequent first, at most maxSize ids in
  /// total (specials included); ties broken by the word. Counts of the special words are ignored.
  static Vocab build(const std::map<std::string, int64_t>& counts, int64_t minCount, int64_t maxSize);

  /// One word per line, in id order (the specials first).
  void save(const std::string& path) const;
  /// Reads a file written by save(); errors name the file and line (missing or misplaced
  /// specials, empty line, duplicate word, invalid UTF-8, a line over kMaxLineBytes). Only a
  /// regular file of at most kMaxVocabFileBytes is read.
  static Vocab load(const std::string& path);
  /// Reads a word list as corpora ship one (1B-Word's vocabulary, say): one word per line, most
  /// frequent first, optionally followed by whitespace and its count ("the 41767866"). The
  /// corpus's markers <S>, </S> and <UNK> (in either case) and <pad> are weft's specials, wherever
  /// they stand; the other words take ids from kFirstWordId in file order, up to maxSize ids in
  /// all (specials included). Errors name the file and line (empty line, a third field or a
  /// count that is not a number, duplicate word, invalid UTF-8, a line over kMaxLineBytes).
  static Vocab loadWordList(const std::string& path, int64_t maxSize);

 private:
  std::vector<std::string> words_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_;
};

/// Byte offset of the first invalid UTF-8 sequence in `text`, or -1 when it is valid.
int64_t invalidUtf8Offset(const std::string& text);

}  // namespace weft::data
