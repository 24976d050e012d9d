// Tests of reading untrusted input: InputFile (regular files only, size and line limits, errors
// naming the file and line) and escapeBytes (what an error message may print of raw bytes).
#include "core/Escape.h"
#include "core/InputFile.h"
#include "tests/InputTest.h"

#include <filesystem>
#include <string>

using namespace weft;

TEST_CASE("escapeBytes keeps printable text and UTF-8, and escapes controls and invalid bytes") {
  CHECK(escapeBytes("plain words 123") == "plain words 123");
  CHECK(escapeBytes("caf\xc3\xa9 \xe2\x82\xac") == "caf\xc3\xa9 \xe2\x82\xac");
  CHECK(escapeBytes("\x1b[2J\x1b]0;owned\x07") == "\\x1b[2J\\x1b]0;owned\\x07");
  CHECK(escapeBytes("a\nb\rc\td\\e") == "a\\nb\\rc\\td\\\\e");
  CHECK(escapeBytes("\xc2\x9b"
                    "31m") == "\\xc2\\x9b31m");                 // C1 CSI, as UTF-8
  CHECK(escapeBytes("x\xe2\x80\xaey") == "x\\xe2\\x80\\xaey");  // right-to-left override
  CHECK(escapeBytes("\xff\xfe"
                    "ab\xc3") == "\\xff\\xfeab\\xc3");  // invalid and truncated
  CHECK(escapeBytes(std::string("a\0b", 3)) == "a\\x00b");
  CHECK(escapeBytes("\x7f") == "\\x7f");
  CHECK(escapeBytes(std::string(100, 'z'), 10) == "zzzzzzzzzz... (100 bytes)");
}

TEST_CASE("InputFile reads lines with their numbers, and bytes") {
  TempDir dir;
  const std::string path = dir.write("lines.txt", "one\n\nthree\nlast without newline");
  InputFile in(path, "test file", 1000);
  CHECK(in.size() == 31);
  std::string line;
  REQUIRE(in.readLine(line));
  CHECK((line == "one" && in.line() == 1));
  REQUIRE(in.readLine(line));
  CHECK((line.empty() && in.line() == 2));
  REQUIRE(in.readLine(line));
  CHECK((line == "three" && in.line() == 3));
  REQUIRE(in.readLine(line));
  CHECK((line == "last without newline" && in.line() == 4));
  CHECK_FALSE(in.readLine(line));
  CHECK(in.offset() == 31);
  CHECK(errorOf([&] { in.fail("bad value {}", 7); }) == path + ":4: bad value 7");

  InputFile bytes(path, "test file", 1000);
  std::vector<uint8_t> four(4);
  CHECK(bytes.read(four) == 4);
  CHECK(std::string(four.begin(), four.end()) == "one\n");
  CHECK(bytes.readAll() == "\nthree\nlast without newline");
  CHECK(bytes.read(four) == 0);
}

TEST_CASE("InputFile refuses what is not a regular file, naming the path and what it is") {
  TempDir dir;
  CHECK(errorOf([&] { InputFile(dir.path.string(), "corpus", 100); }) ==
        "corpus " + dir.path.string() + " is a directory; only a regular file is read");
  CHECK(errorOf([&] { InputFile("/dev/zero", "corpus", 100); }) ==
        "corpus /dev/zero is a character device; only a regular file is read");
  const std::string fifo = makeFifo(dir, "pipe");
  CHECK(contains(fifoError(fifo, [&] { InputFile(fifo, "corpus", 100); }), fifo + " is a FIFO"));
  CHECK(errorOf([&] { InputFile(dir.file("missing"), "corpus", 100); }) ==
        "corpus " + dir.file("missing") + " does not exist");
}

TEST_CASE("InputFile caps the file's size and each line's length") {
  TempDir dir;
  const std::string path = dir.write("big.txt", std::string(101, 'x'));
  CHECK(errorOf([&] { InputFile(path, "corpus", 100); }) ==
        "corpus " + path + " has 101 bytes, over the limit of 100 bytes");
  const std::string lines = dir.write("lines.txt", "short\n" + std::string(200000, 'y') + "\n");
  InputFile in(lines, "corpus", 1000000);
  std::string line;
  REQUIRE(in.readLine(line, 100000));
  CHECK(errorOf([&] { in.readLine(line, 100000); }) == lines + ":2: the line is longer than the limit of 100000 bytes");
}

TEST_CASE("InputFile escapes the path it prints") {
  TempDir dir;
  const std::string odd = dir.file("a\x1b[31mb");
  CHECK(errorOf([&] { InputFile(odd, "corpus", 100); }) == "corpus " + dir.file("a\\x1b[31mb") + " does not exist");
}
