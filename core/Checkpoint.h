// Checkpoints in the safetensors format (an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw bytes), so other tools can
// read them. Each tensor's XXH64 and one of the other metadata are recorded in the metadata
// ("xxh64:NAME", "xxh64:__metadata__") and checked on load. A save writes a temporary file
// created afresh (never through an existing file or link), fsyncs it, renames it over the real
// name and fsyncs the directory, so a crash leaves the previous checkpoint or the new one, never
// a half-written file under the real name; temporaries a crash leaves behind are removed by
// removeStaleTemporaries.
#pragma once

#include "core/Session.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace weft {

/// Tensors by name plus string metadata.
struct TensorFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Whether readSafetensors accepts tensors without a recorded checksum (files of other tools).
enum class Checksums { IfPresent, Required };

/// Writes atomically and durably (see above); throws naming the path, the step that failed and
/// the system's reason. A failed write leaves the previous file and no temporary. Metadata keys
/// beginning with "xxh64:" are reserved for the checksums.
void writeSafetensors(const std::string& path, const TensorFile& file);
/// Reads and validates a file: header size, JSON, every field of every entry (dtype, shape,
/// byte range: in bounds, without overflow, matching the shape, the ranges covering the data
/// without holes or overlaps), metadata values, and the checksums present (all of them with
/// Checksums::Required). Anything wrong is an error naming the file, the field and the value.
/// The checksums are not part of the returned metadata.
TensorFile readSafetensors(const std::string& path, Checksums checksums = Checksums::IfPresent);

/// Removes the temporary files that saves of `path` left behind when their process died
/// (`path`.tmp-PID and `path`.tmp-PID-N of processes no longer running on this machine).
struct RemovedFiles {
  int64_t files = 0;
  uint64_t bytes = 0;
};
RemovedFiles removeStaleTemporaries(const std::string& path);

/// Whole values of the variables a session holds a shard of (Graph::shardVariable), by name.
using WholeValues = std::map<std::string, Tensor>;

/// Saves every variable of the session's graph (optimizer slots and the global step included)
/// and the session's random step (Session::step), with extra metadata. A variable the session
/// holds a shard of is saved whole, from `wholes` (which must hold it, of its whole shape), so a
/// checkpoint never depends on how a job was sharded.
void saveCheckpoint(Session& session, const std::string& path, std::map<std::string, std::string> metadata = {},
                    const WholeValues& wholes = {});
/// Restores a checkpoint into the session: every variable of the graph must be in the file with
/// the same dtype and shape (a shard: its whole shape) and a valid checksum, and the file may hold
/// nothing else; a mismatch is refused with a message listing what differs, before any variable
/// is changed. A shard takes its elements of the whole, and the whole goes into `wholes` when
/// given (for the other workers' shards). Returns the metadata.
std::map<std::string, std::string> restoreCheckpoint(Session& session, const std::string& path,
                                                     WholeValues* wholes = nullptr);
/// Copies shard variable `variable`'s elements out of `whole` (its whole value) into `shard`.
void copyShardOf(const Node& variable, const Tensor& whole, Tensor& shard);

/// The integer metadata field `key` of checkpoint `path`; throws naming the file, the field and
/// the value when it is missing, not an integer, or outside [min, max].
int64_t metadataInteger(const std::map<std::string, std::string>& metadata, const std::string& path,
                        const std::string& key, int64_t min = std::numeric_limits<int64_t>::min(),
                        int64_t max = std::numeric_limits<int64_t>::max());

/// The settings a run records in its checkpoints' metadata as "run.NAME" keys, compared with
/// `settings` (the same keys, now): one line per difference ("DESCRIBED: A in the checkpoint, B
/// now"; a setting missing on either side says so), each key shown as `describe` names it.
std::vector<std::string> settingDifferences(const std::map<std::string, std::string>& settings,
                                            const std::map<std::string, std::string>& metadata,
                                            const std::function<std::string(const std::string& key)>& describe);

}  // namespace weft
