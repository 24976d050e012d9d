// The input cost of one data-parallel worker of N, for the zoo's LM and ResNet training streams
// on their built-in data: holding the whole dataset and cutting the worker's part from each
// whole batch (how workers read before they read parts), against generating only the worker's
// part of each batch (Batcher::readPart over a generated dataset). One JSON line per
// (model, workers, way): setup seconds, bytes of data held, seconds to order an epoch (paid at
// its first batch), and input milliseconds per step after it.
//
// With --corpus DIR (a text corpus: a file or a directory of shards) or --write-corpus MB (a
// corpus of about MB megabytes in --corpus-files files, 100 by default, written into a temporary
// folder first: sentences of 5 to 45 words drawn from a Zipfian 100,000-word vocabulary, as
// 1B-Word's), it measures instead what one LM worker of N pays for the corpus as `weft train lm`
// reads it, with the corpus read as 1 stream (every worker holds it whole) and as N streams
// (each holds its own): each in a process of its own, its peak resident memory, the seconds to
// scan the corpus (counts and lengths), to read the worker's streams (at its first batch), and
// the input milliseconds per step after it.
//
// With --image-folder DIR (an ImageNet-style class folder, such as its train/) or --write-images
// N (N JPEGs of 500 x 375 written into a temporary folder first), it measures instead the ResNet
// training stream of an image folder (batch 32, random 224 crops and flips) made by 1, 2, 4 ...
// input threads (BatchOptions::threads, `weft train resnet --input-threads`), up to the
// machine's: input milliseconds per step and images per second.
//
//     bench_input [--steps 200] [--lm-sentences 400000] [--resnet-images 40000]
//     bench_input --write-images 640 [--steps 20]
//     bench_input --write-corpus 4000 [--corpus-files 100] [--steps 200]
#include "data/Dataset.h"
#include "data/ImageFolder.h"
#include "data/Images.h"
#include "data/SyntheticLanguage.h"
#include "data/TextCorpus.h"
#ifdef WEFT_HAVE_IMAGE_FILES
#include "tests/ImageFiles.h"
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace weft;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// The bytes of a held dataset's tensors.
double heldBytes(const data::Dataset& d) {
  double bytes = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    for (const auto& [field, t] : d[i]) bytes += static_cast<double>(t.bytes());
  }
  return bytes;
}

struct Stream {
  std::string model;
  data::Dataset generated;
  data::BatchOptions options;
  std::vector<std::string> shared;  // fields every part keeps whole
};

struct Cost {
  double epochSeconds;   // the first batch, which orders the epoch
  double perStepMs;      // each batch after it
};

/// The cost of `steps` batches from `batcher`, each passed through `cut`.
template <class Cut>
Cost inputCost(data::Batcher& batcher, int64_t steps, Cut cut) {
  const double start = now();
  cut(batcher.next());
  const double ordered = now();
  for (int64_t s = 1; s < steps; ++s) cut(batcher.next());
  return {ordered - start, (now() - ordered) * 1e3 / static_cast<double>(steps - 1)};
}

void report(const std::string& model, int64_t workers, const char* way, double setup, double held, const Cost& cost) {
  std::printf(
      "{\"model\": \"%s\", \"workers\": %lld, \"way\": \"%s\", \"setup_s\": %.3f, \"held_mb\": %.1f, "
      "\"epoch_order_s\": %.3f, \"input_ms_per_step\": %.3f}\n",
      model.c_str(), static_cast<long long>(workers), way, setup, held / 1e6, cost.epochSeconds, cost.perStepMs);
  std::fflush(stdout);
}

void measure(const Stream& stream, int64_t steps) {
  // Before: every worker held the whole dataset and cut its part from each whole batch.
  const double start = now();
  const data::Dataset held = stream.generated.held();
  const double setup = now() - start, bytes = heldBytes(held);
  for (const int64_t workers : {1, 2, 4, 8}) {
    data::Batcher whole(held, stream.options);
    const Cost cost = inputCost(whole, steps, [&](const data::Batch& b) {
      return workers > 1 ? data::sliceBatch(b, 0, workers, stream.shared) : b;
    });
    report(stream.model, workers, "whole batch, part cut", setup, bytes, cost);
  }
  // After: a worker generates only the examples of its part.
  for (const int64_t workers : {1, 2, 4, 8}) {
    data::Batcher part(stream.generated, stream.options);
    part.readPart(0, workers);
    report(stream.model, workers, "part read", 0, 0, inputCost(part, steps, [](const data::Batch& b) { return b; }));
  }
}

const char* option(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return nullptr;
}

int64_t flag(int argc, char** argv, const char* name, int64_t fallback) {
  const char* value = option(argc, argv, name);
  return value != nullptr ? std::atoll(value) : fallback;
}

#ifdef WEFT_HAVE_IMAGE_FILES
/// `count` JPEGs of 500 x 375 (ImageNet's commonest size), quality 90, in 10 class folders of
/// `root`: smooth gradients with a pattern of their own, so that they compress as photos do.
void writeImages(const std::filesystem::path& root, int64_t count) {
  constexpr int kWidth = 500, kHeight = 375;
  for (int64_t i = 0; i < count; ++i) {
    const std::filesystem::path folder = root / ("class" + std::to_string(i % 10));
    std::filesystem::create_directories(folder);
    std::vector<uint8_t> samples;
    samples.reserve(kWidth * kHeight * 3);
    for (int y = 0; y < kHeight; ++y)
      for (int x = 0; x < kWidth; ++x)
        for (int c = 0; c < 3; ++c)
          samples.push_back(static_cast<uint8_t>((x * (c + 1) + y * (3 - c) + 37 * i + ((x * y) >> 7)) % 256));
    std::ofstream(folder / (std::to_string(i) + ".jpg"), std::ios::binary)
        << testing::jpegBytes(kWidth, kHeight, 3, samples, 90);
  }
}
#endif

/// The ResNet training stream of the image folder `root` made by 1, 2, 4 ... threads.
void measureImageFolder(const std::string& root, int64_t steps) {
  const data::ImageFolder folder = data::loadImageFolder(root, {.size = 224, .training = true});
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned threads = 1; threads <= cores; threads *= 2) {
    data::BatchOptions options;
    options.batchSize = 32;
    options.augment = data::imageFolderAugment({.size = 224});
    options.threads = static_cast<int>(threads);
    data::Batcher batches(folder.examples, options);
    const Cost cost = inputCost(batches, steps, [](const data::Batch& b) { return b; });
    std::printf("{\"stream\": \"image folder\", \"images\": %zu, \"input_threads\": %u, \"input_ms_per_step\": %.1f, "
                "\"images_per_s\": %.0f}\n",
                folder.examples.size(), threads, cost.perStepMs, 32e3 / cost.perStepMs);
    std::fflush(stdout);
  }
}

/// About `megabytes` MB of text in `files` files of `root`: sentences of 5 to 45 words (25 on
/// average, as 1B-Word's), words drawn from a Zipfian (s = 1) vocabulary of 100,000.
void writeCorpus(const std::filesystem::path& root, int64_t megabytes, int64_t files) {
  constexpr int kVocab = 100000, kTable = 1 << 20;
  std::vector<std::string> words(kVocab);
  for (int w = 0; w < kVocab; ++w) words[w] = fmt::format("w{}", w);
  // Word by quantised inverse CDF: entry k is the word at cumulative probability (k + 0.5) / kTable.
  std::vector<double> cdf(kVocab);
  double total = 0;
  for (int w = 0; w < kVocab; ++w) cdf[w] = total += 1.0 / (w + 1);
  std::vector<int32_t> table(kTable);
  for (int k = 0, w = 0; k < kTable; ++k) {
    while (cdf[w] / total < (k + 0.5) / kTable) ++w;
    table[k] = w;
  }
  std::filesystem::create_directories(root);
  uint64_t state = 0x9E3779B97F4A7C15u;
  const auto draw = [&] { return (state = state * 6364136223846793005u + 1442695040888963407u) >> 33; };
  const auto perFile = static_cast<size_t>(megabytes * 1000000 / files);
  for (int64_t f = 0; f < files; ++f) {
    std::string text;
    text.reserve(perFile + 1024);
    while (text.size() < perFile) {
      const uint64_t length = 5 + draw() % 41;
      for (uint64_t i = 0; i < length; ++i) {
        text += words[static_cast<size_t>(table[draw() % kTable])];
        text += i + 1 < length ? ' ' : '\n';
      }
    }
    std::ofstream(root / fmt::format("news.en-{:05d}-of-{:05d}", f + 1, files), std::ios::binary) << text;
  }
}

double seconds(double since) { return now() - since; }

/// In this process: worker 0 of `workers` reading the corpus at `path` as `streams` streams, as
/// `weft train lm` does (the vocabulary built from the counts, the last 5% held out).
void measureCorpusWorker(const std::string& path, int64_t workers, int64_t streams, int64_t steps) {
  double start = now();
  std::map<std::string, int64_t> counts;
  auto scan = std::make_shared<const data::CorpusScan>(data::scanCorpus(data::corpusFiles(path), 100, &counts));
  const data::Vocab vocab = data::Vocab::build(counts, 1, 100000);
  counts.clear();
  const double scanned = seconds(start);
  const size_t sentences = scan->lengths.size(), trainCount = sentences - std::max<size_t>(1, sentences / 20);
  const data::PackedSentences heldout = data::readSentenceRange(*scan, vocab, trainCount, sentences);
  data::BatchOptions options;
  options.batchSize = 128;
  options.padded = {"tokens", "targets"};
  options.counted = {"targets"};
  options.bucketWindow = 32;
  options.streams = streams;
  data::Batcher batcher(data::lmStreams(scan, vocab, trainCount, streams), options);
  if (workers > 1) batcher.readPart(0, workers);
  const Cost cost = inputCost(batcher, steps, [](const data::Batch& b) { return b; });
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  double bytes = 0;
  for (const std::string& file : scan->files) bytes += static_cast<double>(std::filesystem::file_size(file));
  std::printf(
      "{\"corpus_mb\": %.0f, \"sentences\": %zu, \"workers\": %lld, \"streams\": %lld, \"scan_s\": %.1f, "
      "\"first_batch_s\": %.1f, \"input_ms_per_step\": %.3f, \"peak_rss_mb\": %.0f}\n",
      bytes / 1e6, sentences, static_cast<long long>(workers), static_cast<long long>(streams), scanned,
      cost.epochSeconds, cost.perStepMs, static_cast<double>(usage.ru_maxrss) / 1024.0);
  std::fflush(stdout);
}

/// Worker 0 of 1, 2 and 4 reading the corpus whole and in as many streams as workers, each in a
/// child process so that its peak memory is its own.
int measureCorpus(const std::string& path, int64_t steps) {
  for (const auto& [workers, streams] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 1}, {2, 2}, {4, 1}, {4, 4}}) {
    const pid_t child = ::fork();
    if (child == 0) {
      try {
        measureCorpusWorker(path, workers, streams, steps);
        std::_Exit(0);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_input: %s\n", e.what());
        std::_Exit(1);
      }
    }
    int status = 0;
    if (child < 0 || ::waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = std::max<int64_t>(2, flag(argc, argv, "--steps", 200));
  if (const char* root = option(argc, argv, "--image-folder")) {
    measureImageFolder(root, steps);
    return 0;
  }
  if (const int64_t images = flag(argc, argv, "--write-images", 0); images > 0) {
#ifdef WEFT_HAVE_IMAGE_FILES
    const std::filesystem::path root = std::filesystem::temp_directory_path() /
                                       ("bench_input_images_" + std::to_string(::getpid()));
    writeImages(root, images);
    measureImageFolder(root.string(), steps);
    std::filesystem::remove_all(root);
    return 0;
#else
    std::fprintf(stderr, "bench_input: this build reads no image files (no libjpeg)\n");
    return 2;
#endif
  }
  if (const char* corpus = option(argc, argv, "--corpus")) return measureCorpus(corpus, steps);
  if (const int64_t megabytes = flag(argc, argv, "--write-corpus", 0); megabytes > 0) {
    const std::filesystem::path root =
        std::filesystem::temp_directory_path() / ("bench_input_corpus_" + std::to_string(::getpid()));
    writeCorpus(root, megabytes, std::max<int64_t>(1, flag(argc, argv, "--corpus-files", 100)));
    const int status = measureCorpus(root.string(), steps);
    std::filesystem::remove_all(root);
    return status;
  }
  // The zoo's defaults (models/Lm.h, models/ResNet.h) and their batching.
  Stream lm{"lm", data::lmDataset(std::make_shared<const data::SyntheticLanguage>(data::LanguageSpec{}),
                                  static_cast<uint64_t>(flag(argc, argv, "--lm-sentences", 400000))),
            {}, {"targets_count"}};
  lm.options.batchSize = 64;
  lm.options.padded = {"tokens", "targets"};
  lm.options.counted = {"targets"};
  lm.options.bucketWindow = 32;
  Stream resnet{"resnet", data::syntheticImages({}, flag(argc, argv, "--resnet-images", 40000), 102), {}, {}};
  resnet.options.batchSize = 128;
  resnet.options.keepGenerated = true;
  for (const Stream& s : {lm, resnet}) measure(s, steps);
  return 0;
}
