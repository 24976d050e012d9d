// Checkpoints in the safetensors format (an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw bytes), so other tools can
// read them. Files are written to a temporary name and renamed, so a crash never leaves a
// half-written checkpoint under the real name.
#pragma once

#include "core/Session.h"

#include <map>
#include <string>

namespace weft {

/// Tensors by name plus string metadata.
struct TensorFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Writes atomically (temp file, flush, rename); throws naming the path on I/O errors.
void writeSafetensors(const std::string& path, const TensorFile& file);
/// Reads and validates a file: header size, JSON, dtypes, shapes, byte ranges (in bounds, not
/// overlapping, matching the shape). Anything wrong is an error naming the file and the field.
TensorFile readSafetensors(const std::string& path);

/// Saves every variable of the session's graph (optimizer slots and the global step included)
/// and the session's random step (Session::step), with extra metadata.
void saveCheckpoint(Session& session, const std::string& path, std::map<std::string, std::string> metadata = {});
/// Restores a checkpoint into the session: every variable of the graph must be in the file with
/// the same dtype and shape, and the file may hold nothing else; a mismatch is refused with a
/// message listing what differs, before any variable is changed. Returns the metadata.
std::map<std::string, std::string> restoreCheckpoint(Session& session, const std::string& path);

}  // namespace weft
