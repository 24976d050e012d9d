// Vocab: the id tables, frequency-ordered construction, and the vocabulary file format.
#include "data/Vocab.h"

#include "core/Error.h"
#include "core/Escape.h"
#include "core/Hash.h"
#include "core/InputFile.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <fstream>
#include <functional>
#include <limits>
#include <string_view>
#include <unordered_map>

namespace weft::data {
namespace {

const std::vector<std::string>& specialWords() {
  static const std::vector<std::string> words{"<pad>", "<unk>", "<s>", "</s>"};
  return words;
}

/// The special id a corpus's marker stands for (1B-Word writes <S>, </S>, <UNK>), or -1.
int32_t corpusSpecial(const std::string& word) {
  static const std::unordered_map<std::string, int32_t> markers{
      {"<pad>", kPad}, {"<PAD>", kPad}, {"<unk>", kUnk}, {"<UNK>", kUnk},
      {"<s>", kBos},   {"<S>", kBos},   {"</s>", kEos},  {"</S>", kEos}};
  const auto it = markers.find(word);
  return it == markers.end() ? -1 : it->second;
}

std::vector<std::string_view> whitespaceFields(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    const size_t begin = i;
    while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i > begin) fields.push_back(line.substr(begin, i - begin));
  }
  return fields;
}

bool isCount(std::string_view text) {
  int64_t count = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), count);
  return ec == std::errc() && end == text.data() + text.size() && count >= 0;
}

bool isSpecial(const std::string& word) {
  const auto& s = specialWords();
  return std::find(s.begin(), s.end(), word) != s.end();
}

}  // namespace

int64_t invalidUtf8Offset(const std::string& text) {
  uint32_t code = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8SequenceAt(text, i, code);
    if (len == 0) return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

Vocab::Vocab() {
  for (const auto& w : specialWords()) add(w);
}

int32_t Vocab::add(std::string_view word) { return add(word, std::hash<std::string_view>{}(word)); }

int32_t Vocab::add(std::string_view word, uint64_t hash) {
  uint64_t& slot = slots_[slotOf(word, hash)];
  if (slot != 0) return static_cast<int32_t>((slot & 0xffffffffu) - 1);
  WEFT_CHECK(words_.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
             "Vocab: cannot add '{}': it holds {} words, as many as int32 ids number", escapeBytes(word), size());
  const int32_t id = size();
  slot = (hash >> 32 << 32) | (static_cast<uint64_t>(id) + 1);
  words_.emplace_back(word);
  if (words_.size() * 2 > slots_.size()) grow();
  return id;
}

int32_t Vocab::id(std::string_view word) const {
  const int32_t found = find(word);
  return found < 0 ? kUnk : found;
}

void Vocab::fetch(std::span<const std::string_view> words, uint64_t* hashes) const {
  const size_t mask = slots_.size() - 1;
  for (size_t i = 0; i < words.size(); ++i) {
    hashes[i] = std::hash<std::string_view>{}(words[i]);
    __builtin_prefetch(&slots_[hashes[i] & mask]);
  }
  for (size_t i = 0; i < words.size(); ++i) {
    const uint64_t slot = slots_[hashes[i] & mask];
    if (slot != 0) __builtin_prefetch(&words_[(slot & 0xffffffffu) - 1]);
  }
}

void Vocab::ids(std::span<const std::string_view> words, std::vector<int32_t>& ids) const {
  constexpr size_t kAhead = 64;  // words whose entries are fetched at once
  uint64_t hashes[kAhead];
  ids.resize(words.size());
  for (size_t begin = 0; begin < words.size(); begin += kAhead) {
    const std::span<const std::string_view> chunk = words.subspan(begin, std::min(kAhead, words.size() - begin));
    fetch(chunk, hashes);
    for (size_t i = 0; i < chunk.size(); ++i) {
      const int32_t found = static_cast<int32_t>(slots_[slotOf(chunk[i], hashes[i])] & 0xffffffffu) - 1;
      ids[begin + i] = found < 0 ? kUnk : found;
    }
  }
}

void Vocab::addAll(std::span<const std::string_view> words, std::vector<int32_t>& ids) {
  constexpr size_t kAhead = 64;
  uint64_t hashes[kAhead];
  ids.resize(words.size());
  for (size_t begin = 0; begin < words.size(); begin += kAhead) {
    const std::span<const std::string_view> chunk = words.subspan(begin, std::min(kAhead, words.size() - begin));
    fetch(chunk, hashes);
    for (size_t i = 0; i < chunk.size(); ++i) ids[begin + i] = add(chunk[i], hashes[i]);
  }
}

int32_t Vocab::find(std::string_view word) const {
  const uint64_t slot = slots_[slotOf(word, std::hash<std::string_view>{}(word))];
  return static_cast<int32_t>((slot & 0xffffffffu)) - 1;
}

size_t Vocab::slotOf(std::string_view word, uint64_t hash) const {
  const size_t mask = slots_.size() - 1;
  const uint64_t tag = hash >> 32 << 32;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const uint64_t slot = slots_[i];
    if (slot == 0) return i;
    if ((slot & ~uint64_t{0xffffffffu}) == tag && words_[(slot & 0xffffffffu) - 1] == word) return i;
  }
}

void Vocab::grow() {
  std::vector<uint64_t> old(slots_.size() * 2, 0);
  old.swap(slots_);
  const size_t mask = slots_.size() - 1;
  for (const uint64_t slot : old) {
    if (slot == 0) continue;
    // The lower bits of the hash are not in the slot: hash the word again.
    size_t i = std::hash<std::string_view>{}(words_[(slot & 0xffffffffu) - 1]) & mask;
    while (slots_[i] != 0) i = (i + 1) & mask;
    slots_[i] = slot;
  }
}

const std::string& Vocab::word(int32_t id) const {
  WEFT_CHECK(id >= 0 && id < size(), "Vocab::word: id {} is outside the vocabulary of {} ids", id, size());
  return words_[static_cast<size_t>(id)];
}

Vocab Vocab::build(const std::map<std::string, int64_t>& counts, int64_t minCount, int64_t maxSize) {
  WEFT_CHECK(maxSize >= kFirstWordId, "Vocab::build: maxSize {} leaves no room for the {} special ids", maxSize,
             kFirstWordId);
  std::vector<std::pair<int64_t, const std::string*>> kept;
  for (const auto& [word, count] : counts) {
    if (count >= minCount && !isSpecial(word)) kept.emplace_back(count, &word);
  }
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : *a.second < *b.second;
  });
  Vocab v;
  for (const auto& [count, word] : kept) {
    if (v.size() >= maxSize) break;
    v.add(*word);
  }
  return v;
}

void Vocab::save(const std::string& path) const {
  std::ofstream out(path, std::ios::binary);
  WEFT_CHECK(out, "Vocab::save: cannot open '{}' for writing", path);
  for (const auto& w : words_) out << w << '\n';
  WEFT_CHECK(out.good(), "Vocab::save: writing '{}' failed", path);
}

Vocab Vocab::load(const std::string& path) {
  InputFile in(path, "vocabulary file", kMaxVocabFileBytes);
  Vocab v;
  std::string line;
  while (in.readLine(line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) in.fail("empty line in vocabulary file");
    const int64_t bad = invalidUtf8Offset(line);
    if (bad >= 0) in.fail("invalid UTF-8 at byte {} of the line", bad);
    if (in.line() <= kFirstWordId) {
      const std::string& expected = specialWords()[static_cast<size_t>(in.line() - 1)];
      if (line != expected) in.fail("expected the special word '{}', found '{}'", expected, escapeBytes(line));
      continue;
    }
    if (v.find(line) >= 0) in.fail("duplicate word '{}' (first on line {})", escapeBytes(line), v.id(line) + 1);
    WEFT_CHECK(v.size() < INT32_MAX, "{}:{}: more than {} words", in.name(), in.line(), INT32_MAX);
    v.add(line);
  }
  WEFT_CHECK(in.line() >= kFirstWordId, "{}: vocabulary file has {} lines; it must start with the {} special words",
             in.name(), in.line(), kFirstWordId);
  return v;
}

Vocab Vocab::loadWordList(const std::string& path, int64_t maxSize) {
  WEFT_CHECK(maxSize >= kFirstWordId, "Vocab::loadWordList: maxSize {} leaves no room for the {} special ids", maxSize,
             kFirstWordId);
  InputFile in(path, "vocabulary file", kMaxVocabFileBytes);
  Vocab v;
  std::unordered_map<std::string, int64_t> lineOf;  // a duplicate is named with its first line
  std::string line;
  while (v.size() < maxSize && in.readLine(line)) {
    const int64_t bad = invalidUtf8Offset(line);
    if (bad >= 0) in.fail("invalid UTF-8 at byte {} of the line", bad);
    const std::vector<std::string_view> fields = whitespaceFields(line);
    if (fields.empty()) in.fail("empty line in vocabulary file");
    if (fields.size() > 2)
      in.fail("'{}' after the word and its count; expected WORD [COUNT]", escapeBytes(std::string(fields[2])));
    if (fields.size() == 2 && !isCount(fields[1]))
      in.fail("the count '{}' is not a number", escapeBytes(std::string(fields[1])));
    const std::string word(fields[0]);
    const int32_t special = corpusSpecial(word);
    const std::string key = special >= 0 ? specialWords()[static_cast<size_t>(special)] : word;
    const auto [first, fresh] = lineOf.emplace(key, in.line());
    if (!fresh) in.fail("duplicate word '{}' (first on line {})", escapeBytes(word), first->second);
    if (special < 0) v.add(word);
  }
  return v;
}

uint64_t Vocab::hash(uint64_t seed) const {
  for (const std::string& word : words_) {
    const uint64_t bytes = word.size();  // so that words cut elsewhere hash otherwise
    seed = xxh64(&bytes, sizeof bytes, xxh64(word.data(), word.size(), seed));
  }
  return seed;
}

}  // namespace weft::data
