// Tree-structured sentiment data: the Stanford Sentiment Treebank's bracketed format
// (docs/tree-format.md) with a checking loader and a writer, and a seeded compositional
// sentiment task whose labels need the tree structure.
//
//     Vocab vocab;
//     std::vector<Tree> train = loadTrees("sst/train.txt", vocab, /*grow=*/true);
//     std::vector<Tree> dev = loadTrees("sst/dev.txt", vocab, /*grow=*/false);  // unknown words: kUnk
#pragma once

#include "data/Vocab.h"

#include <cstdint>
#include <string>
#include <vector>

namespace weft::data {

/// A binarised tree. Nodes are numbered in post-order (children before their parent, the left
/// subtree before the right), so the root is the last node.
struct Tree {
  std::vector<int32_t> left, right;  ///< child node ids; -1 at leaves
  std::vector<int32_t> parent;       ///< -1 at the root
  std::vector<int32_t> word;         ///< vocabulary id at leaves; -1 at inner nodes
  std::vector<int32_t> label;        ///< class per node, 0 .. classes-1

  int32_t size() const { return static_cast<int32_t>(left.size()); }
  /// The last node; -1 for an empty tree.
  int32_t root() const { return size() - 1; }
  /// Throws naming the node when it is out of range.
  bool isLeaf(int32_t node) const;
  /// The longest root-to-leaf path in edges (0 for a single leaf); throws on a tree whose
  /// children are not numbered before their parent.
  int32_t depth() const;

  bool operator==(const Tree&) const = default;
};

inline constexpr int64_t kSentimentClasses = 5;
/// Limits of one tree, so that a hostile file can neither overflow a recursive consumer's stack
/// nor make a line allocate without bound: at most kMaxTreeDepth nodes on a root-to-leaf path
/// (brackets open at once; depth() < kMaxTreeDepth), and at most kMaxTreeNodes nodes.
inline constexpr int64_t kMaxTreeDepth = 1024;
inline constexpr int64_t kMaxTreeNodes = 65535;
/// The largest tree file loadTrees reads.
inline constexpr uint64_t kMaxTreeFileBytes = uint64_t{1} << 30;

/// Parses trees in the Stanford Sentiment Treebank's bracketed format, one tree per non-empty
/// line: "(3 (2 It) (4 (2 's) (3 lovely)))": a leaf is "(label word)", an inner node
/// "(label left right)". Words are mapped through `vocab`, adding new words when `grow` is true
/// (all or nothing: on an error `vocab` is left as it was); otherwise unknown words map to kUnk.
/// The word "<unk>" is kUnk; the other reserved words ("<pad>", "<s>", "</s>") are refused.
/// Errors name the file, line, column and the offending text (escaped): unbalanced or missing
/// brackets, a missing label or one that is not an integer in [0, classes), a node with no word
/// and no children, a unary inner node, more than two children, a word beside a subtree or a
/// second word, trailing text after a tree, invalid UTF-8 in a word, and trees over the limits
/// above (parsed iteratively, so deep nesting cannot overflow the stack). Only a regular file of
/// at most kMaxTreeFileBytes, with lines of at most kMaxLineBytes, is read.
std::vector<Tree> loadTrees(const std::string& path, Vocab& vocab, bool grow, int64_t classes = kSentimentClasses);
/// The same from text in memory; `sourceName` stands for the file in messages.
std::vector<Tree> parseTrees(const std::string& text, const std::string& sourceName, Vocab& vocab, bool grow,
                             int64_t classes = kSentimentClasses);
/// Writes trees in the format loadTrees reads, one per line (loading them with the same vocab
/// gives them back exactly). Every tree is checked first (checkTree, and that its words can be
/// written: no whitespace or brackets), so a bad tree leaves no file behind.
void saveTrees(const std::string& path, const std::vector<Tree>& trees, const Vocab& vocab);

/// Checks a tree's invariants: equal-length arrays, 1 .. kMaxTreeNodes nodes, post-order
/// numbering, parent/child consistency, one root (the last node), labels in [0, classes), word
/// ids at leaves only (kUnk or kFirstWordId .. vocabSize-1), depth within kMaxTreeDepth. Throws
/// "WHAT: node N: ..." naming the tree (`what`) and the node.
void checkTree(const Tree& tree, int64_t classes, int64_t vocabSize, const std::string& what);

/// The built-in sentiment task: random binary trees (the leaves split uniformly at every node)
/// over a vocabulary of neutral ("the3"), positive ("good3"), negative ("bad3"), intensifier
/// ("very3") and negation ("not3") words. Each node has a score: +1 / -1 at positive / negative
/// leaves, 0 at other leaves; at an inner node, if a child is a negation leaf the score is minus
/// its sibling's, else if a child is an intensifier leaf it is twice its sibling's, else the
/// children's sum, clamped to [-4, 4]. The label buckets the score: <= -2 -> 0, -1 -> 1,
/// 0 -> 2 (neutral), 1 -> 3, >= 2 -> 4. Negation makes the labels depend on the bracketing, so a
/// bag of words cannot predict them perfectly.
struct CompositionalTreeSpec {
  int64_t minLeaves = 2;  ///< 1 <= minLeaves <= maxLeaves <= kMaxTreeDepth
  int64_t maxLeaves = 12;
  int64_t wordsPerKind = 10;  ///< 1 .. 100000
};
/// The generator's vocabulary: the specials, then wordsPerKind words of each kind in the order
/// the, good, bad, very, not (so "good0" is kFirstWordId + wordsPerKind).
Vocab compositionalVocab(const CompositionalTreeSpec& spec);
/// `count` trees over compositionalVocab(spec), labelled by the rule; tree i is a function of
/// (spec, seed, i) alone.
std::vector<Tree> compositionalTrees(const CompositionalTreeSpec& spec, int64_t count, uint64_t seed);
/// The rule's label for every node of `tree`, whose words are ids of compositionalVocab(spec)
/// (kUnk counts as neutral): to relabel a tree after changing its words or its bracketing.
std::vector<int32_t> compositionalLabels(const Tree& tree, const CompositionalTreeSpec& spec);

}  // namespace weft::data
