// TensorBoard event files: scalars by tag and step, which `tensorboard --logdir DIR` plots.
//
//     TensorBoardWriter board("runs/lm/tensorboard");
//     board.scalar("train/loss", loss, step);
//
// The file (DIR/events.out.tfevents.SECONDS.HOST.PID.N) is a sequence of TFRecords, each an Event
// protocol buffer: a version record first, then one record per scalar. Every record is flushed
// as it is written, so TensorBoard shows a run while it trains and a killed run keeps what it
// wrote.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace weft {

class TensorBoardWriter {
 public:
  /// Creates `dir` if needed and a new event file in it; throws naming the path on failure.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// Appends `value` (stored as float, as TensorBoard's scalars are) under `tag` at `step`.
  void scalar(const std::string& tag, double value, int64_t step);
  const std::string& path() const { return path_; }

 private:
  void writeRecord(std::string_view data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

/// CRC-32C (Castagnoli), continuing from `crc`: the checksum TFRecord framing uses.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace weft
