// The seeded mutation driver: runs a fuzz target on its generated seeds and on mutations of them
// (bit flips, interesting bytes and integers, inserted, deleted, duplicated and spliced ranges),
// all drawn from one seeded stream, so a run is reproducible from its seed.
//
//   fuzz_TARGET [--runs N] [--seconds S] [--seed K] [--max-len BYTES] [FILE...]
//
// With FILEs it runs each once (to reproduce a finding) and stops. A finding — a sanitizer
// report, a crash, an exception other than weft::Error — leaves the input that caused it in
// ./crash-TARGET-SEED-RUN and ends the process with a failure status.
#include "fuzz/Fuzz.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <typeinfo>
#include <vector>

extern "C" void __sanitizer_set_death_callback(void (*callback)()) __attribute__((weak));

namespace {

// The input being run, kept where a signal handler or the sanitizers' death callback can write it.
std::vector<uint8_t> current;
char crashPath[512] = "";

void saveCurrent() {
  if (crashPath[0] == '\0') return;
  const int fd = ::open(crashPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  weft::fuzz::writeAll(fd, current);
  ::close(fd);
  const char note[] = "fuzz: the input is saved in ";
  [[maybe_unused]] ssize_t ignored = ::write(STDERR_FILENO, note, sizeof note - 1);
  ignored = ::write(STDERR_FILENO, crashPath, std::strlen(crashPath));
  ignored = ::write(STDERR_FILENO, "\n", 1);
}

void onFatalSignal(int signal) {
  saveCurrent();
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

/// splitmix64: the driver's one random stream.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }

 private:
  uint64_t state_;
};

// clang-format off
const std::vector<std::string>& interestingTokens() {
  static const std::vector<std::string> tokens{
      "0", "-1", "1", "9", "10", "255", "256", "65535", "65536", "1024", "1025", "2147483647", "2147483648",
      "4294967296", "9223372036854775807", "-9223372036854775808", "99999999999999999999", "1e9", "1e308", "nan",
      "inf", "-", "\n", "\r\n", " ", "\t", "#", "=", "\"", "{", "}", "[", "]", ",", ":", "\\u0000", "\x1b[2J",
      "\xc2\x9b", "\xff", "\xc0\xaf", "\xed\xa0\x80"};
  return tokens;
}

const std::vector<uint64_t>& interestingIntegers() {
  static const std::vector<uint64_t> values{0, 1, 2, 7, 8, 16, 28, 32, 127, 128, 255, 256, 4096, 65535, 65536,
                                            0x7fffffffull, 0x80000000ull, 0xffffffffull, 0x100000000ull,
                                            0x7fffffffffffffffull, 0x8000000000000000ull, ~0ull};
  return values;
}

// clang-format on

void mutate(std::vector<uint8_t>& x, const std::vector<std::vector<uint8_t>>& corpus, Random& r, size_t maxLen) {
  const size_t steps = 1 + r.below(6);
  for (size_t s = 0; s < steps; ++s) {
    const size_t at = r.below(x.size() + 1);
    switch (r.below(10)) {
      case 0:  // flip a bit
        if (!x.empty()) x[r.below(x.size())] ^= static_cast<uint8_t>(1u << r.below(8));
        break;
      case 1:  // a random byte
        if (!x.empty()) x[r.below(x.size())] = static_cast<uint8_t>(r.next());
        break;
      case 2: {  // insert random bytes
        const size_t n = 1 + r.below(8);
        for (size_t k = 0; k < n; ++k)
          x.insert(x.begin() + static_cast<std::ptrdiff_t>(at), static_cast<uint8_t>(r.next()));
        break;
      }
      case 3: {  // delete a range
        if (x.empty()) break;
        const size_t from = r.below(x.size()), n = 1 + r.below(std::min<size_t>(x.size() - from, 64));
        x.erase(x.begin() + static_cast<std::ptrdiff_t>(from), x.begin() + static_cast<std::ptrdiff_t>(from + n));
        break;
      }
      case 4: {  // duplicate a range
        if (x.empty()) break;
        const size_t from = r.below(x.size()), n = 1 + r.below(std::min<size_t>(x.size() - from, 64));
        const std::vector<uint8_t> part(x.begin() + static_cast<std::ptrdiff_t>(from),
                                        x.begin() + static_cast<std::ptrdiff_t>(from + n));
        x.insert(x.begin() + static_cast<std::ptrdiff_t>(at), part.begin(), part.end());
        break;
      }
      case 5:
      case 6: {  // an interesting token, inserted or written over
        const std::string& t = interestingTokens()[r.below(interestingTokens().size())];
        if (r.below(2) == 0 || at + t.size() > x.size()) {
          x.insert(x.begin() + static_cast<std::ptrdiff_t>(at), t.begin(), t.end());
        } else {
          std::copy(t.begin(), t.end(), x.begin() + static_cast<std::ptrdiff_t>(at));
        }
        break;
      }
      case 7: {  // an interesting integer, little-endian, written over 1, 2, 4 or 8 bytes
        const size_t width = size_t{1} << r.below(4);
        if (x.size() < width) break;
        const size_t pos = r.below(x.size() - width + 1);
        const uint64_t v = interestingIntegers()[r.below(interestingIntegers().size())];
        for (size_t k = 0; k < width; ++k) x[pos + k] = static_cast<uint8_t>(v >> (8 * k));
        break;
      }
      case 8: {  // splice: this input's head, another's tail
        const std::vector<uint8_t>& other = corpus[r.below(corpus.size())];
        const size_t from = r.below(other.size() + 1);
        x.resize(at);
        x.insert(x.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        break;
      }
      default:  // truncate
        x.resize(at);
        break;
    }
  }
  if (x.size() > maxLen) x.resize(maxLen);
}

void runOne(const std::vector<uint8_t>& input) {
  current = input;
  LLVMFuzzerTestOneInput(current.data(), current.size());
}

[[noreturn]] void usage(const char* program) {
  std::fprintf(stderr, "usage: %s [--runs N] [--seconds S] [--seed K] [--max-len BYTES] [FILE...]\n", program);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t runs = 0, seed = 1;
  double seconds = 0;
  size_t maxLen = 64 << 10;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool hasValue = i + 1 < argc;
    if (a == "--runs" && hasValue) {
      runs = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--seconds" && hasValue) {
      seconds = std::strtod(argv[++i], nullptr);
    } else if (a == "--seed" && hasValue) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--max-len" && hasValue) {
      maxLen = std::strtoull(argv[++i], nullptr, 10);
    } else if (a.starts_with("-")) {
      usage(argv[0]);
    } else {
      files.push_back(a);
    }
  }
  const std::string target = std::filesystem::path(argv[0]).filename().string();
  std::set_terminate([] {
    if (const std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        std::fprintf(stderr, "fuzz: finding: an exception other than weft::Error escaped: %s: %s\n", typeid(x).name(),
                     x.what());
      } catch (...) {
        std::fprintf(stderr, "fuzz: finding: an exception of unknown type escaped\n");
      }
    }
    saveCurrent();
    std::_Exit(1);
  });
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(saveCurrent);
  for (const int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(s, onFatalSignal);

  if (!files.empty()) {
    for (const std::string& f : files) {
      const std::string bytes = weft::fuzz::fileBytes(f);
      runOne({bytes.begin(), bytes.end()});
      std::printf("fuzz %s: %s ran\n", target.c_str(), f.c_str());
    }
    return 0;
  }
  if (runs == 0 && seconds <= 0) runs = 1000;
  std::vector<std::vector<uint8_t>> corpus;
  for (const std::string& s : weftFuzzSeeds()) corpus.emplace_back(s.begin(), s.end());
  if (corpus.empty()) corpus.emplace_back();

  Random random(seed);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  uint64_t done = 0;
  for (; (runs == 0 || done < runs) && (seconds <= 0 || elapsed() < seconds); ++done) {
    std::snprintf(crashPath, sizeof crashPath, "crash-%s-%llu-%llu", target.c_str(),
                  static_cast<unsigned long long>(seed), static_cast<unsigned long long>(done));
    std::vector<uint8_t> input = corpus[done % corpus.size()];
    if (done >= corpus.size()) mutate(input, corpus, random, maxLen);  // the seeds themselves first
    runOne(input);
  }
  std::printf("fuzz %s: %llu inputs (%zu seeds) in %.1f s, seed %llu: no findings\n", target.c_str(),
              static_cast<unsigned long long>(done), corpus.size(), elapsed(), static_cast<unsigned long long>(seed));
  return 0;
}
