// The bracketed tree format (structure, round trip and every parser error), tree checks, and
// the compositional sentiment generator against an independent recursive reference.
#include "data/Trees.h"
#include "tests/InputTest.h"
#include "tests/TestUtil.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace weft;
using namespace weft::data;

namespace {

/// The parser's error for `text` (as file "trees.txt"); it must name the source.
std::string parseError(const std::string& text, int64_t classes = kSentimentClasses) {
  Vocab vocab;
  const std::string e = errorOf([&] { parseTrees(text, "trees.txt", vocab, true, classes); });
  CHECK_MESSAGE(contains(e, "trees.txt:"), e);
  return e;
}

/// The loader's error for a file holding `text`; it must name the file.
std::string loadError(const std::string& text) {
  TempDir dir;
  const std::string path = dir.write("bad.txt", text);
  Vocab vocab;
  const std::string e = errorOf([&] { loadTrees(path, vocab, true); });
  CHECK_MESSAGE(contains(e, path), e);
  return e;
}

std::string repeat(const std::string& s, int64_t times) {
  std::string out;
  for (int64_t i = 0; i < times; ++i) out += s;
  return out;
}

/// A right comb with `pathNodes` nodes on its longest root-to-leaf path.
std::string comb(int64_t pathNodes) {
  return repeat("(1 (1 w) ", pathNodes - 1) + "(1 w)" + repeat(")", pathNodes - 1);
}

/// A complete binary tree of height `h` (2^(h+1) - 1 nodes).
std::string balanced(int h) { return h == 0 ? "(0 w)" : "(0 " + balanced(h - 1) + " " + balanced(h - 1) + ")"; }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The generator's rule, written independently: recursion over the tree, the word's kind read
/// from its spelling.
std::string kindOf(const Tree& t, const Vocab& v, int32_t node) {
  if (t.left[static_cast<size_t>(node)] >= 0) return "";
  std::string w = v.word(t.word[static_cast<size_t>(node)]);
  while (!w.empty() && w.back() >= '0' && w.back() <= '9') w.pop_back();
  return w;
}

int referenceScore(const Tree& t, const Vocab& v, int32_t node) {
  const auto i = static_cast<size_t>(node);
  int score = 0;
  if (t.left[i] < 0) {
    const std::string kind = kindOf(t, v, node);
    score = kind == "good" ? 1 : kind == "bad" ? -1 : 0;
  } else {
    const int32_t l = t.left[i], r = t.right[i];
    const std::string kl = kindOf(t, v, l), kr = kindOf(t, v, r);
    if (kl == "not")
      score = -referenceScore(t, v, r);
    else if (kr == "not")
      score = -referenceScore(t, v, l);
    else if (kl == "very")
      score = 2 * referenceScore(t, v, r);
    else if (kr == "very")
      score = 2 * referenceScore(t, v, l);
    else
      score = referenceScore(t, v, l) + referenceScore(t, v, r);
  }
  return std::max(-4, std::min(4, score));
}

int referenceLabel(int score) {
  static const int bucket[9] = {0, 0, 0, 1, 2, 3, 4, 4, 4};  // scores -4 .. 4
  return bucket[score + 4];
}

/// The tree of "(3 (2 a) (2 b))", for breaking.
Tree twoLeaves() {
  Vocab v;
  return parseTrees("(3 (2 a) (2 b))", "t", v, true).at(0);
}

}  // namespace

// ---- Parsing ---------------------------------------------------------------------------------

TEST_CASE("an SST line parses into post-order nodes with the exact structure, labels and words") {
  Vocab vocab;
  const std::vector<Tree> trees = parseTrees("(3 (2 It) (4 (2 's) (3 lovely)))\n", "sst", vocab, true);
  REQUIRE(trees.size() == 1);
  const Tree& t = trees[0];
  // Post-order: It, 's, lovely, ('s lovely), root.
  CHECK(t.size() == 5);
  CHECK(t.root() == 4);
  CHECK(t.left == std::vector<int32_t>{-1, -1, -1, 1, 0});
  CHECK(t.right == std::vector<int32_t>{-1, -1, -1, 2, 3});
  CHECK(t.parent == std::vector<int32_t>{4, 3, 3, 4, -1});
  CHECK(t.label == std::vector<int32_t>{2, 2, 3, 4, 3});
  CHECK(t.word == std::vector<int32_t>{4, 5, 6, -1, -1});
  CHECK(vocab.size() == 7);
  CHECK(vocab.word(4) == "It");
  CHECK(vocab.word(5) == "'s");
  CHECK(vocab.word(6) == "lovely");
  CHECK(t.depth() == 2);
  CHECK(t.isLeaf(0));
  CHECK_FALSE(t.isLeaf(3));
  CHECK(contains(errorOf([&] { t.isLeaf(5); }), "node 5 is outside the tree of 5 nodes"));
  checkTree(t, kSentimentClasses, vocab.size(), "sst");
}

TEST_CASE("blank lines are skipped, CRLF and tabs are whitespace, brackets need no spaces") {
  Vocab vocab;
  const std::vector<Tree> trees = parseTrees("\n(1 a)\r\n  \t\n(3(2 a)(0\tb))\r\n\n", "t", vocab, true);
  REQUIRE(trees.size() == 2);
  CHECK(trees[0].word == std::vector<int32_t>{4});
  CHECK(trees[0].label == std::vector<int32_t>{1});
  CHECK(trees[0].depth() == 0);
  CHECK(trees[1].word == std::vector<int32_t>{4, 5, -1});
  CHECK(trees[1].label == std::vector<int32_t>{2, 0, 3});
  Vocab none;
  CHECK(parseTrees("", "t", none, true).empty());
}

TEST_CASE("without grow, unknown words map to kUnk and the vocabulary is unchanged") {
  Vocab vocab;
  vocab.add("good");
  const std::vector<Tree> trees = parseTrees("(3 (3 good) (2 movie))", "t", vocab, false);
  CHECK(trees.at(0).word == std::vector<int32_t>{4, kUnk, -1});
  CHECK(vocab.size() == 5);
  CHECK(parseTrees("(2 <unk>)", "t", vocab, false).at(0).word == std::vector<int32_t>{kUnk});
  CHECK(parseTrees("(2 <unk>)", "t", vocab, true).at(0).word == std::vector<int32_t>{kUnk});
  CHECK(vocab.size() == 5);
}

TEST_CASE("an error while growing leaves the vocabulary as it was") {
  Vocab vocab;
  CHECK(contains(errorOf([&] { parseTrees("(2 fresh)\n(3 (2 other) (9 x))\n", "t", vocab, true); }), "t:2:15:"));
  CHECK(vocab.size() == kFirstWordId);
  CHECK(vocab.id("fresh") == kUnk);
}

TEST_CASE("loadTrees reads a file with line numbers and columns in its errors") {
  TempDir dir;
  const std::string path = dir.write("ok.txt", "(4 (3 great) (2 fun))\n(0 awful)\n");
  Vocab vocab;
  const std::vector<Tree> trees = loadTrees(path, vocab, true);
  REQUIRE(trees.size() == 2);
  CHECK(trees[1].label == std::vector<int32_t>{0});
  CHECK(vocab.word(trees[1].word[0]) == "awful");
  CHECK(contains(loadError("(2 a)\n(2 b)\n(7 c)\n"), ":3:2: label '7' is not an integer in [0, 5)"));
}

// ---- Round trips -----------------------------------------------------------------------------

TEST_CASE("generated trees round-trip through a file exactly") {
  TempDir dir;
  const CompositionalTreeSpec spec;
  const Vocab vocab = compositionalVocab(spec);
  const std::vector<Tree> trees = compositionalTrees(spec, 50, 3);
  saveTrees(dir.file("t.txt"), trees, vocab);
  Vocab same = vocab;
  CHECK(loadTrees(dir.file("t.txt"), same, false) == trees);
  CHECK(same.size() == vocab.size());
  Vocab fresh;  // a new vocabulary numbers the words differently, but they are the same words
  const std::vector<Tree> loaded = loadTrees(dir.file("t.txt"), fresh, true);
  REQUIRE(loaded.size() == trees.size());
  for (size_t k = 0; k < trees.size(); ++k) {
    CHECK(loaded[k].left == trees[k].left);
    CHECK(loaded[k].label == trees[k].label);
    for (int32_t v = 0; v < trees[k].size(); ++v) {
      if (trees[k].isLeaf(v))
        CHECK(fresh.word(loaded[k].word[static_cast<size_t>(v)]) == vocab.word(trees[k].word[static_cast<size_t>(v)]));
    }
  }
}

TEST_CASE("a canonical file is written back byte for byte") {
  TempDir dir;
  const std::string text = "(3 (2 It) (4 (2 's) (3 lovely)))\n(1 (0 (2 not) (4 good)) (2 <unk>))\n(2 caf\xc3\xa9)\n";
  Vocab vocab;
  const std::vector<Tree> trees = loadTrees(dir.write("in.txt", text), vocab, true);
  saveTrees(dir.file("out.txt"), trees, vocab);
  CHECK(slurp(dir.file("out.txt")) == text);
}

TEST_CASE("saveTrees refuses a word it cannot write, and a bad tree, leaving no file") {
  TempDir dir;
  Vocab vocab;
  vocab.add("a");
  vocab.add("b");
  const int32_t spaced = vocab.add("two words");
  Tree t = twoLeaves();
  t.word[0] = spaced;
  const std::string e = errorOf([&] { saveTrees(dir.file("out.txt"), {t}, vocab); });
  CHECK_MESSAGE(contains(e, "saveTrees: tree 0: node 0: the word 'two words' cannot be written"), e);
  Tree bad = twoLeaves();
  bad.label[1] = -1;
  CHECK(contains(errorOf([&] {
                   saveTrees(dir.file("out.txt"), {twoLeaves(), bad}, vocab);
                 }),
                 "saveTrees: tree 1: node 1: label -1"));
  CHECK_FALSE(std::filesystem::exists(dir.file("out.txt")));
}

// ---- Malformed input -------------------------------------------------------------------------

TEST_CASE("a missing ')' names the line, the unclosed bracket's column and the text") {
  const std::string e = parseError("(2 a)\n\n(3 (2 b) (2 c)\n");
  CHECK_MESSAGE(contains(e, "trees.txt:3:1: missing ')'"), e);
  CHECK_MESSAGE(contains(e, "'(3 (2 b) (2 c)'"), e);
}

TEST_CASE("an unbalanced ')' names the line and column") {
  CHECK(contains(parseError("(2 a))\n"), "trees.txt:1:6: unbalanced ')': no bracket is open here: ')'"));
  CHECK(contains(parseError("(2 a)\n) (2 b)\n"), "trees.txt:2:1: unbalanced ')'"));
}

TEST_CASE("a line that does not start with '(' is refused") {
  CHECK(contains(parseError("(2 a)\nhello (2 a)\n"), "trees.txt:2:1: expected '(' to start a tree, found 'hello'"));
}

TEST_CASE("a missing label is refused") {
  CHECK(contains(parseError("((2 a) (2 b))"), "trees.txt:1:2: missing label: '(' follows the '(' at column 1"));
  CHECK(contains(parseError("(2 a)\n()\n"), "trees.txt:2:1: missing label: '()'"));
}

TEST_CASE("a label that is not an integer in [0, classes) is refused") {
  CHECK(contains(parseError("(x a)"), "trees.txt:1:2: label 'x' is not an integer in [0, 5)"));
  CHECK(contains(parseError("(2 a)\n(5 a)"), "trees.txt:2:2: label '5' is not an integer in [0, 5)"));
  CHECK(contains(parseError("(3 (-1 a) (2 b))"), "trees.txt:1:5: label '-1' is not"));
  CHECK(contains(parseError("(2.0 a)"), "label '2.0' is not"));
  CHECK(contains(parseError("(99999999999999999999 a)"), "label '99999999999999999999' is not"));
  CHECK(contains(parseError("(2 a)", 2), "trees.txt:1:2: label '2' is not an integer in [0, 2)"));
  Vocab vocab;
  CHECK(parseTrees("(1 a)", "t", vocab, true, 2).at(0).label == std::vector<int32_t>{1});
  CHECK(contains(errorOf([&] { parseTrees("(0 a)", "t", vocab, true, 0); }), "classes must be in 1.."));
}

TEST_CASE("a node with no word and no children (an empty word) is refused") {
  CHECK(contains(parseError("(2 )"), "trees.txt:1:1: a node with no word and no children"));
  const std::string e = parseError("(3 (2 a) (1))");
  CHECK_MESSAGE(contains(e, "trees.txt:1:10: a node with no word and no children"), e);
  CHECK_MESSAGE(contains(e, "'(1)'"), e);
}

TEST_CASE("a unary inner node is refused") {
  const std::string e = parseError("(2 a)\n(3 (2 a))\n");
  CHECK_MESSAGE(contains(e, "trees.txt:2:1: a unary inner node"), e);
  CHECK_MESSAGE(contains(e, "'(3 (2 a))'"), e);
}

TEST_CASE("a node with more than two children is refused") {
  const std::string e = parseError("(3 (2 a) (2 b) (2 c))");
  CHECK_MESSAGE(contains(e, "trees.txt:1:16: a node with more than two children"), e);
  CHECK_MESSAGE(contains(e, "'(2 c))'"), e);
}

TEST_CASE("a leaf holds exactly one word and no subtree") {
  CHECK(contains(parseError("(2 a b)"), "trees.txt:1:6: a second word 'b' in a leaf"));
  CHECK(contains(parseError("(3 a (2 b))"), "trees.txt:1:6: a subtree beside a word"));
  CHECK(contains(parseError("(3 (2 a) b)"), "trees.txt:1:10: a word 'b' beside a subtree"));
}

TEST_CASE("trailing text after a tree is refused") {
  CHECK(contains(parseError("(2 a) b"), "trees.txt:1:7: trailing text after the tree: 'b'"));
  CHECK(contains(parseError("(2 a)\n(2 a) (2 b)"), "trees.txt:2:7: trailing text after the tree: '(2 b)'"));
}

TEST_CASE("words must be valid UTF-8 and not reserved; quoted bytes are escaped") {
  CHECK(contains(parseError("(2 a\xff)"), "trees.txt:1:4: word 'a\\xff' is not valid UTF-8 (byte 1)"));
  CHECK(contains(parseError("(2 <pad>)"), "trees.txt:1:4: word '<pad>' is reserved"));
  CHECK(contains(parseError("(3 (2 </s>) (2 a))"), "word '</s>' is reserved"));
  const std::string e = parseError("(2 a) \x1b]2;title\x07");
  CHECK_MESSAGE(contains(e, "trailing text after the tree: '\\x1b]2;title\\x07'"), e);
  CHECK_FALSE(contains(e, "\x1b"));
}

TEST_CASE("hostile deep nesting is refused without crashing") {
  const std::string deep = repeat("(2 ", 100000);
  CHECK(
      contains(parseError(deep), "trees.txt:1:3073: brackets nested more than 1024 deep (kMaxTreeDepth): '(2 (2 (2 "));
  CHECK(contains(parseError(deep + "a" + std::string(100000, ')')), "trees.txt:1:3073: brackets nested more than"));
  CHECK(contains(loadError("(2 a)\n" + deep + "\n"), ":2:3073: brackets nested more than 1024 deep"));
  // Bare brackets stop at the second one, which has no label before it.
  CHECK(contains(parseError(std::string(100000, '(')), "trees.txt:1:2: missing label"));
}

TEST_CASE("nesting is accepted up to kMaxTreeDepth nodes on a path, and refused past it") {
  Vocab vocab;
  const std::vector<Tree> trees = parseTrees(comb(kMaxTreeDepth), "t", vocab, true);
  REQUIRE(trees.size() == 1);
  CHECK(trees[0].depth() == kMaxTreeDepth - 1);
  CHECK(trees[0].size() == 2 * kMaxTreeDepth - 1);
  checkTree(trees[0], kSentimentClasses, vocab.size(), "comb");
  CHECK(contains(parseError(comb(kMaxTreeDepth + 1)), "brackets nested more than 1024 deep"));
}

TEST_CASE("a tree over kMaxTreeNodes nodes is refused") {
  static_assert(kMaxTreeNodes == (1 << 16) - 1);
  Vocab vocab;
  const std::vector<Tree> ok = parseTrees(balanced(15), "t", vocab, true);  // 2^16 - 1 nodes
  REQUIRE(ok.size() == 1);
  CHECK(ok[0].size() == kMaxTreeNodes);
  CHECK(ok[0].depth() == 15);
  const std::string e = parseError("(2 a)\n" + balanced(16));
  CHECK_MESSAGE(contains(e, "trees.txt:2:"), e);
  CHECK_MESSAGE(contains(e, "the tree has more than 65535 nodes"), e);
}

TEST_CASE("tree files that are not regular files are refused") {
  TempDir dir;
  Vocab vocab;
  CHECK(contains(errorOf([&] { loadTrees(dir.path.string(), vocab, true); }), "is a directory"));
  CHECK(contains(errorOf([&] { loadTrees("/dev/null", vocab, true); }), "/dev/null is a character device"));
  const std::string fifo = makeFifo(dir, "trees.fifo");
  CHECK(contains(fifoError(fifo, [&] { loadTrees(fifo, vocab, true); }), fifo + " is a FIFO"));
  CHECK(contains(errorOf([&] { loadTrees("/nonexistent/weft/trees.txt", vocab, true); }),
                 "/nonexistent/weft/trees.txt does not exist"));
}

// ---- checkTree -------------------------------------------------------------------------------

TEST_CASE("checkTree names the tree and node of a broken invariant") {
  const Tree good = twoLeaves();
  checkTree(good, 5, 6, "tree 7");
  auto broken = [&](const std::function<void(Tree&)>& change) {
    Tree t = good;
    change(t);
    return errorOf([&] { checkTree(t, 5, 6, "tree 7"); });
  };
  CHECK(contains(broken([](Tree& t) { t.label[2] = 5; }), "tree 7: node 2: label 5 is outside [0, 5)"));
  CHECK(contains(broken([](Tree& t) { std::swap(t.left[2], t.right[2]); }),
                 "tree 7: node 2: children (left 1, right 0) are not numbered in post-order"));
  CHECK(contains(broken([](Tree& t) { t.parent[0] = -1; }), "tree 7: node 0: parent -1 does not have it as a child"));
  CHECK(contains(broken([](Tree& t) { t.parent[2] = 0; }), "tree 7: node 2: the root has parent 0"));
  CHECK(contains(broken([](Tree& t) { t.word[2] = 4; }), "tree 7: node 2: an inner node has word id 4"));
  CHECK(contains(broken([](Tree& t) { t.word[0] = 6; }), "tree 7: node 0: leaf word id 6 is not kUnk"));
  CHECK(contains(broken([](Tree& t) { t.word[1] = kPad; }), "tree 7: node 1: leaf word id 0 is not kUnk"));
  CHECK(contains(broken([](Tree& t) { t.label.pop_back(); }), "tree 7: the node arrays differ in length"));
  CHECK(contains(broken([](Tree& t) { t = Tree{}; }), "tree 7: the tree has no nodes"));
  // Two separate leaves: the last node is a leaf, so node 0 hangs below nothing.
  CHECK(contains(broken([](Tree& t) {
                   t = Tree{{-1, -1}, {-1, -1}, {-1, -1}, {4, 5}, {2, 2}};
                 }),
                 "tree 7: node 0 is not below the root"));
}

// ---- The compositional generator -------------------------------------------------------------

TEST_CASE("the generator's vocabulary names words by kind") {
  const Vocab v = compositionalVocab({.wordsPerKind = 3});
  CHECK(v.size() == kFirstWordId + 15);
  CHECK(v.word(kFirstWordId) == "the0");
  CHECK(v.word(kFirstWordId + 3) == "good0");
  CHECK(v.word(kFirstWordId + 8) == "bad2");
  CHECK(v.word(kFirstWordId + 9) == "very0");
  CHECK(v.word(kFirstWordId + 14) == "not2");
}

TEST_CASE("the generator is deterministic and tree i depends only on (seed, i)") {
  const CompositionalTreeSpec spec;
  const std::vector<Tree> a = compositionalTrees(spec, 40, 5), b = compositionalTrees(spec, 40, 5);
  const std::vector<Tree> prefix = compositionalTrees(spec, 10, 5), other = compositionalTrees(spec, 40, 6);
  CHECK(a == b);
  CHECK(prefix == std::vector<Tree>(a.begin(), a.begin() + 10));
  int differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != other[i];
  CHECK(differing > 30);
  CHECK(compositionalTrees(spec, 0, 5).empty());
}

TEST_CASE("generated trees are valid, within the spec, and labelled by the rule") {
  const CompositionalTreeSpec spec{.minLeaves = 3, .maxLeaves = 9, .wordsPerKind = 4};
  const Vocab vocab = compositionalVocab(spec);
  const std::vector<Tree> trees = compositionalTrees(spec, 300, 11);
  std::vector<int64_t> leavesSeen(10, 0);
  for (size_t k = 0; k < trees.size(); ++k) {
    const Tree& t = trees[k];
    checkTree(t, kSentimentClasses, vocab.size(), fmt::format("tree {}", k));
    const int32_t leaves = (t.size() + 1) / 2;
    REQUIRE(leaves >= 3);
    REQUIRE(leaves <= 9);
    ++leavesSeen[static_cast<size_t>(leaves)];
    for (int32_t v = 0; v < t.size(); ++v) {
      CAPTURE(k);
      CAPTURE(v);
      CHECK(t.label[static_cast<size_t>(v)] == referenceLabel(referenceScore(t, vocab, v)));
    }
    CHECK(compositionalLabels(t, spec) == t.label);
  }
  for (int64_t leaves = 3; leaves <= 9; ++leaves) CHECK(leavesSeen[static_cast<size_t>(leaves)] > 0);
}

TEST_CASE("all five classes occur, at nodes and at roots, in a few hundred trees") {
  const std::vector<Tree> trees = compositionalTrees({}, 300, 1);
  std::vector<int64_t> nodes(kSentimentClasses, 0), roots(kSentimentClasses, 0);
  for (const Tree& t : trees) {
    for (const int32_t label : t.label) ++nodes[static_cast<size_t>(label)];
    ++roots[static_cast<size_t>(t.label.back())];
  }
  for (int64_t c = 0; c < kSentimentClasses; ++c) {
    CAPTURE(c);
    CHECK(nodes[static_cast<size_t>(c)] > 0);
    CHECK(roots[static_cast<size_t>(c)] > 0);
  }
}

TEST_CASE("the same words bracketed differently get different labels (a bag of words cannot tell)") {
  const CompositionalTreeSpec spec;
  Vocab vocab = compositionalVocab(spec);
  // ((not good) good): -1 + 1 = 0, neutral.   (not (good good)): -(1 + 1) = -2, very negative.
  const std::vector<Tree> trees =
      parseTrees("(0 (0 (0 not0) (0 good0)) (0 good1))\n(0 (0 not0) (0 (0 good0) (0 good1)))\n", "t", vocab, false);
  REQUIRE(trees.size() == 2);
  CHECK(compositionalLabels(trees[0], spec) == std::vector<int32_t>{2, 3, 1, 3, 2});
  CHECK(compositionalLabels(trees[1], spec) == std::vector<int32_t>{2, 3, 3, 4, 0});
  // Intensifiers double, negation beats an intensifier, scores clamp at +-4.
  const std::vector<Tree> more = parseTrees(
      "(0 (0 very1) (0 bad2))\n(0 (0 not1) (0 very0))\n"
      "(0 (0 (0 very0) (0 (0 very1) (0 (0 very2) (0 good0)))) (0 (0 bad0) (0 (0 bad1) (0 bad2))))\n",
      "t", vocab, false);
  REQUIRE(more.size() == 3);
  CHECK(compositionalLabels(more[0], spec).back() == 0);  // -2
  CHECK(compositionalLabels(more[1], spec).back() == 2);  // -(0)
  CHECK(compositionalLabels(more[2], spec).back() == 3);  // min(8, 4) - 3 = 1, not 8 - 3
}

TEST_CASE("invalid generator specs are refused with the offending value") {
  CHECK(contains(errorOf([] { compositionalTrees({.minLeaves = 0}, 1, 1); }), "minLeaves (0)"));
  CHECK(contains(errorOf([] { compositionalTrees({.minLeaves = 5, .maxLeaves = 4}, 1, 1); }), "maxLeaves (4)"));
  CHECK(contains(errorOf([] { compositionalTrees({.maxLeaves = 2000}, 1, 1); }), "<= 1024"));
  CHECK(contains(errorOf([] { compositionalVocab({.wordsPerKind = 0}); }), "wordsPerKind 0 is outside"));
  CHECK(contains(errorOf([] { compositionalTrees({}, -1, 1); }), "count -1 is negative"));
}

TEST_CASE("single-leaf and maximal specs generate valid trees") {
  const CompositionalTreeSpec one{.minLeaves = 1, .maxLeaves = 1, .wordsPerKind = 1};
  for (const Tree& t : compositionalTrees(one, 20, 2)) {
    CHECK(t.size() == 1);
    checkTree(t, kSentimentClasses, compositionalVocab(one).size(), "one");
  }
  const CompositionalTreeSpec big{.minLeaves = kMaxTreeDepth, .maxLeaves = kMaxTreeDepth, .wordsPerKind = 2};
  for (const Tree& t : compositionalTrees(big, 3, 2))
    checkTree(t, kSentimentClasses, compositionalVocab(big).size(), "big");
}
