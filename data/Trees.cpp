// The bracketed tree format (loader and writer), tree checks, and the compositional sentiment
// generator.
#include "data/Trees.h"

#include "core/Error.h"
#include "core/Escape.h"
#include "core/InputFile.h"
#include "core/Random.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <fstream>
#include <string_view>

namespace weft::data {
namespace {

// ---- Format helpers --------------------------------------------------------------------------

bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }
/// A byte that may appear in a word: anything but whitespace, brackets and the line end.
bool isWordByte(char c) { return !isSpace(c) && c != '(' && c != ')' && c != '\n'; }
bool isReserved(int32_t id) { return id == kPad || id == kBos || id == kEos; }

/// Why `word` cannot be a leaf's word in the bracketed format; "" when it can.
std::string unwritable(const std::string& word) {
  if (word.empty()) return "it is empty";
  for (const char c : word) {
    if (!isWordByte(c)) return "it contains whitespace or a bracket";
  }
  const int64_t bad = invalidUtf8Offset(word);
  if (bad >= 0) return fmt::format("it is not valid UTF-8 (byte {})", bad);
  return "";
}

void checkClasses(const char* who, int64_t classes) {
  WEFT_CHECK(classes >= 1 && classes <= INT32_MAX, "{}: classes must be in 1..{}, got {}", who, INT32_MAX, classes);
}

/// Parses lines into trees. Iterative: the open brackets are an explicit stack of at most
/// kMaxTreeDepth entries.
class TreeParser {
 public:
  TreeParser(std::string source, Vocab& vocab, bool grow, int64_t classes)
      : source_(std::move(source)), vocab_(vocab), grow_(grow), classes_(classes) {}

  /// Appends the tree of `line` (line number `lineNo`) to `out`; a blank line adds nothing.
  void parseLine(std::string_view line, int64_t lineNo, std::vector<Tree>& out) {
    line_ = line;
    lineNo_ = lineNo;
    open_.clear();
    Tree tree;
    int64_t nodes = 0;
    bool done = false;
    size_t i = 0;
    for (;;) {
      while (i < line.size() && isSpace(line[i])) ++i;
      if (i == line.size()) break;
      const size_t at = i;
      const char c = line[i];
      if (done) {
        if (c == ')') fail(at, "unbalanced ')': no bracket is open here: '{}'", rest(at));
        fail(at, "trailing text after the tree: '{}'", rest(at));
      }
      if (c == '(') {
        if (!open_.empty()) {
          const Open& top = open_.back();
          if (top.label < 0)
            fail(at, "missing label: '(' follows the '(' at column {}: '{}'", top.at + 1, rest(top.at));
          if (top.word >= 0) fail(at, "a subtree beside a word (a leaf is '(label word)'): '{}'", rest(top.at));
          if (top.children == 2) fail(at, "a node with more than two children (the third starts here): '{}'", rest(at));
        }
        if (static_cast<int64_t>(open_.size()) >= kMaxTreeDepth)
          fail(at, "brackets nested more than {} deep (kMaxTreeDepth): '{}'", kMaxTreeDepth, rest(at));
        if (nodes >= kMaxTreeNodes)
          fail(at, "the tree has more than {} nodes (kMaxTreeNodes): '{}'", kMaxTreeNodes, rest(at));
        ++nodes;
        open_.push_back(Open{at});
        ++i;
      } else if (c == ')') {
        if (open_.empty()) fail(at, "unbalanced ')': no bracket is open here: '{}'", rest(at));
        const Open node = open_.back();
        open_.pop_back();
        const std::string text = escapeBytes(line.substr(node.at, at + 1 - node.at));
        if (node.label < 0) fail(node.at, "missing label: '{}'", text);
        if (node.word < 0 && node.children == 0)
          fail(node.at, "a node with no word and no children (a leaf is '(label word)' with a word): '{}'", text);
        if (node.children == 1) fail(node.at, "a unary inner node (an inner node is '(label left right)'): '{}'", text);
        const int32_t id = tree.size();
        const bool leaf = node.children == 0;
        tree.left.push_back(leaf ? -1 : node.child[0]);
        tree.right.push_back(leaf ? -1 : node.child[1]);
        tree.parent.push_back(-1);
        tree.word.push_back(leaf ? node.word : -1);
        tree.label.push_back(node.label);
        if (!leaf)
          tree.parent[static_cast<size_t>(node.child[0])] = tree.parent[static_cast<size_t>(node.child[1])] = id;
        if (open_.empty()) {
          done = true;
        } else {
          Open& up = open_.back();
          up.child[up.children++] = id;  // checked when this node's '(' opened
        }
        ++i;
      } else {
        while (i < line.size() && isWordByte(line[i])) ++i;
        const std::string_view token = line.substr(at, i - at);
        if (open_.empty()) fail(at, "expected '(' to start a tree, found '{}'", escapeBytes(token));
        Open& top = open_.back();
        if (top.label < 0) {
          top.label = parseLabel(token, at);
        } else if (top.word >= 0) {
          fail(at, "a second word '{}' in a leaf (a leaf is '(label word)'): '{}'", escapeBytes(token), rest(top.at));
        } else if (top.children > 0) {
          fail(at, "a word '{}' beside a subtree (an inner node is '(label left right)'): '{}'", escapeBytes(token),
               rest(top.at));
        } else {
          top.word = wordId(token, at);
        }
      }
    }
    if (!open_.empty()) {
      const Open& top = open_.back();
      fail(top.at, "missing ')': the bracket opened here is not closed by the end of the line ({} open): '{}'",
           open_.size(), rest(top.at));
    }
    if (done) out.push_back(std::move(tree));
  }

 private:
  /// A node whose ')' has not been read yet.
  struct Open {
    size_t at = 0;  // byte offset of its '('
    int32_t label = -1;
    int32_t word = -1;
    int32_t child[2] = {-1, -1};
    int children = 0;
  };

  template <class... A>
  [[noreturn]] void fail(size_t at, fmt::format_string<A...> format, A&&... args) const {
    WEFT_THROW("{}:{}:{}: {}", source_, lineNo_, at + 1, fmt::format(format, std::forward<A>(args)...));
  }

  /// The line from byte `at` on, escaped and cut to kEscapedBytesShown bytes.
  std::string rest(size_t at) const { return escapeBytes(line_.substr(at)); }

  int32_t parseLabel(std::string_view token, size_t at) const {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), v);
    if (ec != std::errc() || end != token.data() + token.size() || v < 0 || v >= classes_)
      fail(at, "label '{}' is not an integer in [0, {})", escapeBytes(token), classes_);
    return static_cast<int32_t>(v);
  }

  int32_t wordId(std::string_view token, size_t at) {
    const std::string word(token);
    const int64_t bad = invalidUtf8Offset(word);
    if (bad >= 0) fail(at, "word '{}' is not valid UTF-8 (byte {})", escapeBytes(token), bad);
    const int32_t known = vocab_.id(word);
    if (isReserved(known)) fail(at, "word '{}' is reserved for the vocabulary's special ids", escapeBytes(token));
    if (known != kUnk || !grow_) return known;
    WEFT_CHECK(vocab_.size() < INT32_MAX, "{}:{}:{}: the vocabulary is full", source_, lineNo_, at + 1);
    return vocab_.add(word);
  }

  std::string source_;
  Vocab& vocab_;
  bool grow_;
  int64_t classes_;
  std::string_view line_;
  int64_t lineNo_ = 0;
  std::vector<Open> open_;
};

/// Runs `parse(vocab)` on a copy of `vocab` when growing it, so an error leaves it untouched.
template <class F>
std::vector<Tree> withVocab(Vocab& vocab, bool grow, F&& parse) {
  if (!grow) return parse(vocab);
  Vocab grown = vocab;
  std::vector<Tree> trees = parse(grown);
  vocab = std::move(grown);
  return trees;
}

// ---- The compositional task ------------------------------------------------------------------

enum Kind : int32_t { kNeutral, kPositive, kNegative, kIntensifier, kNegation, kKinds, kInner = -1 };
const char* const kKindPrefix[kKinds] = {"the", "good", "bad", "very", "not"};
constexpr int64_t kMaxWordsPerKind = 100000;
constexpr int64_t kScoreLimit = 4;

void checkSpec(const char* who, const CompositionalTreeSpec& spec) {
  WEFT_CHECK(spec.minLeaves >= 1 && spec.minLeaves <= spec.maxLeaves && spec.maxLeaves <= kMaxTreeDepth,
             "{}: leaves must satisfy 1 <= minLeaves ({}) <= maxLeaves ({}) <= {}", who, spec.minLeaves, spec.maxLeaves,
             kMaxTreeDepth);
  WEFT_CHECK(spec.wordsPerKind >= 1 && spec.wordsPerKind <= kMaxWordsPerKind, "{}: wordsPerKind {} is outside 1..{}",
             who, spec.wordsPerKind, kMaxWordsPerKind);
}

int32_t labelOfScore(int64_t score) { return score <= -2 ? 0 : score >= 2 ? 4 : static_cast<int32_t>(score + 2); }

/// A leaf's word: neutral 6/20, positive 4/20, negative 4/20, intensifier 3/20, negation 3/20.
int32_t drawWord(Draws& draw, int64_t wordsPerKind) {
  const int64_t r = draw.below(20);
  const int64_t kind = r < 6 ? kNeutral : r < 10 ? kPositive : r < 14 ? kNegative : r < 17 ? kIntensifier : kNegation;
  return static_cast<int32_t>(kFirstWordId + kind * wordsPerKind + draw.below(wordsPerKind));
}

/// One tree of `leaves` leaves, built in post-order without recursion: each node with more than
/// one leaf splits them uniformly into a left part of 1 .. leaves-1 and a right part.
Tree drawTree(const CompositionalTreeSpec& spec, uint64_t key) {
  Draws draw(key);
  const int64_t leaves = spec.minLeaves + draw.below(spec.maxLeaves - spec.minLeaves + 1);
  struct Frame {
    int64_t leaves;
    int64_t split = 0;
    int32_t left = -1;
  };
  Tree t;
  std::vector<Frame> stack{{leaves}};
  int32_t made = -1;  // the node just finished, to hand to its parent frame
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (made < 0 && f.leaves == 1) {
      made = t.size();
      t.left.push_back(-1);
      t.right.push_back(-1);
      t.parent.push_back(-1);
      t.word.push_back(drawWord(draw, spec.wordsPerKind));
      t.label.push_back(0);
      stack.pop_back();
    } else if (made < 0) {  // entering an inner node: draw the split, build the left part
      f.split = 1 + draw.below(f.leaves - 1);
      stack.push_back({f.split});
    } else if (f.left < 0) {  // the left part is done: build the right part
      f.left = made;
      made = -1;
      const int64_t right = f.leaves - f.split;
      stack.push_back({right});
    } else {  // both parts done
      const int32_t id = t.size();
      t.left.push_back(f.left);
      t.right.push_back(made);
      t.parent.push_back(-1);
      t.word.push_back(-1);
      t.label.push_back(0);
      t.parent[static_cast<size_t>(f.left)] = t.parent[static_cast<size_t>(made)] = id;
      made = id;
      stack.pop_back();
    }
  }
  t.label = compositionalLabels(t, spec);
  return t;
}

}  // namespace

// ---- Tree ------------------------------------------------------------------------------------

bool Tree::isLeaf(int32_t node) const {
  WEFT_CHECK(node >= 0 && node < size(), "Tree::isLeaf: node {} is outside the tree of {} nodes", node, size());
  return left[static_cast<size_t>(node)] < 0;
}

int32_t Tree::depth() const {
  WEFT_CHECK(right.size() == left.size(), "Tree::depth: {} left and {} right children", left.size(), right.size());
  std::vector<int32_t> height(left.size(), 0);
  for (int32_t v = 0; v < size(); ++v) {
    const auto i = static_cast<size_t>(v);
    if (left[i] < 0) continue;
    for (const int32_t c : {left[i], right[i]}) {
      WEFT_CHECK(c >= 0 && c < v, "Tree::depth: node {} has child {}, not numbered before it", v, c);
      height[i] = std::max(height[i], height[static_cast<size_t>(c)] + 1);
    }
  }
  return height.empty() ? 0 : height.back();
}

void checkTree(const Tree& t, int64_t classes, int64_t vocabSize, const std::string& what) {
  const size_t n = t.left.size();
  WEFT_CHECK(t.right.size() == n && t.parent.size() == n && t.word.size() == n && t.label.size() == n,
             "{}: the node arrays differ in length (left {}, right {}, parent {}, word {}, label {})", what, n,
             t.right.size(), t.parent.size(), t.word.size(), t.label.size());
  WEFT_CHECK(n >= 1, "{}: the tree has no nodes", what);
  WEFT_CHECK(static_cast<int64_t>(n) <= kMaxTreeNodes, "{}: {} nodes, over the limit of {}", what, n, kMaxTreeNodes);
  std::vector<int64_t> span(n), height(n);  // nodes in each subtree; its height in edges
  for (size_t i = 0; i < n; ++i) {
    const auto v = static_cast<int64_t>(i);
    const int32_t l = t.left[i], r = t.right[i];
    WEFT_CHECK(t.label[i] >= 0 && t.label[i] < classes, "{}: node {}: label {} is outside [0, {})", what, v, t.label[i],
               classes);
    if (l == -1 && r == -1) {
      WEFT_CHECK(t.word[i] == kUnk || (t.word[i] >= kFirstWordId && t.word[i] < vocabSize),
                 "{}: node {}: leaf word id {} is not kUnk ({}) nor in [{}, {})", what, v, t.word[i], kUnk,
                 kFirstWordId, vocabSize);
      span[i] = 1;
      height[i] = 0;
      continue;
    }
    WEFT_CHECK(v >= 1 && r == v - 1 && span[i - 1] <= v - 1 && l == v - 1 - span[i - 1],
               "{}: node {}: children (left {}, right {}) are not numbered in post-order (expected right {}, left {})",
               what, v, l, r, v - 1, v >= 1 ? v - 1 - span[i - 1] : -1);
    WEFT_CHECK(t.word[i] == -1, "{}: node {}: an inner node has word id {} (expected -1)", what, v, t.word[i]);
    const auto li = static_cast<size_t>(l), ri = static_cast<size_t>(r);
    span[i] = 1 + span[li] + span[ri];
    height[i] = 1 + std::max(height[li], height[ri]);
  }
  const size_t root = n - 1;
  WEFT_CHECK(span[root] == static_cast<int64_t>(n),
             "{}: node 0 is not below the root (node {}, whose subtree holds {} of the {} nodes)", what, root,
             span[root], n);
  WEFT_CHECK(t.parent[root] == -1, "{}: node {}: the root has parent {} (expected -1)", what, root, t.parent[root]);
  for (size_t i = 0; i < root; ++i) {
    const int32_t p = t.parent[i];
    const bool ok = p > static_cast<int64_t>(i) && p < static_cast<int64_t>(n) &&
                    (t.left[static_cast<size_t>(p)] == static_cast<int32_t>(i) ||
                     t.right[static_cast<size_t>(p)] == static_cast<int32_t>(i));
    WEFT_CHECK(ok, "{}: node {}: parent {} does not have it as a child", what, i, p);
  }
  WEFT_CHECK(height[root] < kMaxTreeDepth, "{}: depth {}: more than {} nodes on a root-to-leaf path (kMaxTreeDepth)",
             what, height[root], kMaxTreeDepth);
}

// ---- The bracketed format --------------------------------------------------------------------

std::vector<Tree> loadTrees(const std::string& path, Vocab& vocab, bool grow, int64_t classes) {
  checkClasses("loadTrees", classes);
  InputFile in(path, "tree file", kMaxTreeFileBytes);
  return withVocab(vocab, grow, [&](Vocab& v) {
    TreeParser parser(in.name(), v, grow, classes);
    std::vector<Tree> trees;
    for (std::string line; in.readLine(line);) parser.parseLine(line, in.line(), trees);
    return trees;
  });
}

std::vector<Tree> parseTrees(const std::string& text, const std::string& sourceName, Vocab& vocab, bool grow,
                             int64_t classes) {
  checkClasses("parseTrees", classes);
  return withVocab(vocab, grow, [&](Vocab& v) {
    TreeParser parser(escapeBytes(sourceName, 4096), v, grow, classes);
    std::vector<Tree> trees;
    const std::string_view all(text);
    int64_t lineNo = 0;
    for (size_t begin = 0; begin < all.size();) {
      const size_t end = std::min(all.find('\n', begin), all.size());
      parser.parseLine(all.substr(begin, end - begin), ++lineNo, trees);
      begin = end + 1;
    }
    return trees;
  });
}

void saveTrees(const std::string& path, const std::vector<Tree>& trees, const Vocab& vocab) {
  std::string text;
  for (size_t k = 0; k < trees.size(); ++k) {
    const Tree& t = trees[k];
    const std::string what = fmt::format("saveTrees: tree {}", k);
    checkTree(t, INT32_MAX, vocab.size(), what);
    // Pre-order from the post-order arrays: a stack of nodes to open (>= 0) and to close (~node).
    std::vector<int32_t> stack{t.root()};
    while (!stack.empty()) {
      const int32_t v = stack.back();
      stack.pop_back();
      if (v < 0) {
        text += ')';
        continue;
      }
      const auto i = static_cast<size_t>(v);
      if (v != t.root()) text += ' ';
      text += '(';
      text += std::to_string(t.label[i]);
      if (t.left[i] < 0) {
        const std::string& word = vocab.word(t.word[i]);
        const std::string why = unwritable(word);
        WEFT_CHECK(why.empty(), "{}: node {}: the word '{}' cannot be written: {}", what, v, escapeBytes(word), why);
        text += ' ';
        text += word;
        text += ')';
      } else {  // each child writes the space before it
        stack.push_back(~v);
        stack.push_back(t.right[i]);
        stack.push_back(t.left[i]);
      }
    }
    text += '\n';
  }
  std::ofstream out(path, std::ios::binary);
  WEFT_CHECK(out.is_open(), "saveTrees: cannot write tree file '{}'", escapeBytes(path, 4096));
  out << text;
  out.flush();
  WEFT_CHECK(out.good(), "saveTrees: error writing tree file '{}'", escapeBytes(path, 4096));
}

// ---- The compositional task ------------------------------------------------------------------

Vocab compositionalVocab(const CompositionalTreeSpec& spec) {
  checkSpec("compositionalVocab", spec);
  Vocab v;
  for (const char* prefix : kKindPrefix) {
    for (int64_t k = 0; k < spec.wordsPerKind; ++k) v.add(prefix + std::to_string(k));
  }
  return v;
}

std::vector<int32_t> compositionalLabels(const Tree& t, const CompositionalTreeSpec& spec) {
  checkSpec("compositionalLabels", spec);
  const size_t n = t.left.size();
  WEFT_CHECK(t.right.size() == n && t.word.size() == n, "compositionalLabels: the node arrays differ in length");
  const int64_t vocabEnd = kFirstWordId + kKinds * spec.wordsPerKind;
  std::vector<int64_t> score(n);
  std::vector<int32_t> kind(n), labels(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t l = t.left[i], r = t.right[i], w = t.word[i];
    if (l < 0) {
      WEFT_CHECK(w == kUnk || (w >= kFirstWordId && w < vocabEnd),
                 "compositionalLabels: node {}: word id {} is not in the generator's vocabulary of {} ids", i, w,
                 vocabEnd);
      kind[i] = w == kUnk ? kNeutral : static_cast<int32_t>((w - kFirstWordId) / spec.wordsPerKind);
      score[i] = kind[i] == kPositive ? 1 : kind[i] == kNegative ? -1 : 0;
    } else {
      WEFT_CHECK(l < static_cast<int64_t>(i) && r >= 0 && r < static_cast<int64_t>(i),
                 "compositionalLabels: node {}: children {} and {} are not numbered before it", i, l, r);
      const auto li = static_cast<size_t>(l), ri = static_cast<size_t>(r);
      int64_t s = 0;
      if (kind[li] == kNegation)
        s = -score[ri];
      else if (kind[ri] == kNegation)
        s = -score[li];
      else if (kind[li] == kIntensifier)
        s = 2 * score[ri];
      else if (kind[ri] == kIntensifier)
        s = 2 * score[li];
      else
        s = score[li] + score[ri];
      score[i] = std::clamp<int64_t>(s, -kScoreLimit, kScoreLimit);
      kind[i] = kInner;
    }
    labels[i] = labelOfScore(score[i]);
  }
  return labels;
}

std::vector<Tree> compositionalTrees(const CompositionalTreeSpec& spec, int64_t count, uint64_t seed) {
  checkSpec("compositionalTrees", spec);
  WEFT_CHECK(count >= 0, "compositionalTrees: count {} is negative", count);
  const uint64_t base = streamKey(seed, "compositional_trees");
  std::vector<Tree> out;
  out.reserve(static_cast<size_t>(std::min<int64_t>(count, int64_t{1} << 20)));
  for (int64_t i = 0; i < count; ++i) out.push_back(drawTree(spec, mix64(base ^ mix64(static_cast<uint64_t>(i)))));
  return out;
}

}  // namespace weft::data
