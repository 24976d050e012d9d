// A word <-> id mapping for language data, with four reserved ids (padding, unknown word,
// sentence start and end) and a one-word-per-line file format.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
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
  int32_t add(std::string_view word);
  /// The id of `word`, or kUnk when unknown.
  int32_t id(std::string_view word) const;
  /// id() of each of `words`, into `ids`. A corpus's lookups wait on memory, not arithmetic:
  /// this fetches the table's entries for many words before it compares any.
  void ids(std::span<const std::string_view> words, std::vector<int32_t>& ids) const;
  /// add() of each of `words`, in order, into `ids`, fetching ahead as ids() does.
  void addAll(std::span<const std::string_view> words, std::vector<int32_t>& ids);
  /// The word of `id`; throws naming the id when out of range.
  const std::string& word(int32_t id) const;
  int32_t size() const { return static_cast<int32_t>(words_.size()); }
  /// XXH64 of the words in id order, from `seed`: what a dataset of ids depends on.
  uint64_t hash(uint64_t seed) const;

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
  /// The id of `word`, or -1.
  int32_t find(std::string_view word) const;
  /// The slot that holds `word` (hashed to `hash`), or the empty slot where it would go.
  size_t slotOf(std::string_view word, uint64_t hash) const;
  int32_t add(std::string_view word, uint64_t hash);
  /// Hashes `words` into `hashes` and starts fetching their slots and the words those hold.
  void fetch(std::span<const std::string_view> words, uint64_t* hashes) const;
  void grow();

  std::vector<std::string> words_;
  // Ids by word: open addressing with linear probing, at most half full. A slot is 0 when empty,
  // else the word's hash's upper 32 bits above its id + 1, so most probes that miss compare no
  // string. Corpora look up every token here (hundreds of millions), and a node-based map's
  // pointer chase cost twice as much.
  std::vector<uint64_t> slots_ = std::vector<uint64_t>(64, 0);
};

/// Byte offset of the first invalid UTF-8 sequence in `text`, or -1 when it is valid.
int64_t invalidUtf8Offset(const std::string& text);

}  // namespace weft::data
