// Vocab: the id tables, frequency-ordered construction, and the vocabulary file format.
#include "data/Vocab.h"

#include "core/Error.h"

#include <algorithm>
#include <fstream>

namespace weft::data {
namespace {

const std::vector<std::string>& specialWords() {
  static const std::vector<std::string> words{"<pad>", "<unk>", "<s>", "</s>"};
  return words;
}

bool isSpecial(const std::string& word) {
  const auto& s = specialWords();
  return std::find(s.begin(), s.end(), word) != s.end();
}

}  // namespace

int64_t invalidUtf8Offset(const std::string& text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    size_t len = 0;
    uint32_t minCode = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) { len = 2; minCode = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; minCode = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; minCode = 0x10000; }
    else return static_cast<int64_t>(i);
    if (i + len > n) return static_cast<int64_t>(i);
    uint32_t code = c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      code = (code << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not valid UTF-8.
    if (code < minCode || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

Vocab::Vocab() {
  for (const auto& w : specialWords()) add(w);
}

int32_t Vocab::add(const std::string& word) {
  const auto [it, inserted] = ids_.emplace(word, size());
  if (inserted) words_.push_back(word);
  return it->second;
}

int32_t Vocab::id(const std::string& word) const {
  const auto it = ids_.find(word);
  return it == ids_.end() ? kUnk : it->second;
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
  std::ifstream in(path, std::ios::binary);
  WEFT_CHECK(in, "Vocab::load: cannot open '{}'", path);
  Vocab v;
  std::string line;
  int64_t lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    WEFT_CHECK(!line.empty(), "{}:{}: empty line in vocabulary file", path, lineNo);
    const int64_t bad = invalidUtf8Offset(line);
    WEFT_CHECK(bad < 0, "{}:{}: invalid UTF-8 at byte {} of the line", path, lineNo, bad);
    if (lineNo <= kFirstWordId) {
      const std::string& expected = specialWords()[static_cast<size_t>(lineNo - 1)];
      WEFT_CHECK(line == expected, "{}:{}: expected the special word '{}', found '{}'", path, lineNo, expected,
                 line);
      continue;
    }
    WEFT_CHECK(v.ids_.count(line) == 0, "{}:{}: duplicate word '{}' (first on line {})", path, lineNo, line,
               v.id(line) + 1);
    v.add(line);
  }
  WEFT_CHECK(lineNo >= kFirstWordId, "{}: vocabulary file has {} lines; it must start with the {} special words",
             path, lineNo, kFirstWordId);
  return v;
}

}  // namespace weft::data
