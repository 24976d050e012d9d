// A timeline of what a process did, in the trace-event JSON format that chrome://tracing and
// Perfetto open: every op a session runs, and what other layers record (a pipeline's micro-batch
// actions and waits, the collectives). Tracing is off unless started; each event then costs two
// clock reads and a lock.
//
//     weft::startTracing();
//     ... session.run(...) ...
//     std::ofstream(path) << weft::traceEventsJson(0, "worker 0");  // {"traceEvents": [...]}
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace weft {

using TraceClock = std::chrono::steady_clock;

/// Starts recording this process's events (dropping any recorded before).
void startTracing();
/// Stops recording; the events recorded so far are kept.
void stopTracing();
bool tracing();
/// Records `name` from `start` until `end` on track `track` (a row of the viewer), in `category`.
/// `bytes`, when not negative, is stored in the event's args: for an op, the bytes of its inputs
/// and outputs (what a memory roofline counts). Does nothing unless tracing.
void traceEvent(const std::string& name, const std::string& category, const char* track,
                TraceClock::time_point start, TraceClock::time_point end, int64_t bytes = -1);

/// Records from its construction to its destruction (when tracing).
class TraceScope {
 public:
  TraceScope(std::string name, std::string category, const char* track);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  std::string name_;
  std::string category_;
  const char* track_;
  TraceClock::time_point start_;
};

/// The recorded events as one JSON document, {"traceEvents": [...]}, under process id `pid`
/// named `process`. Times are microseconds of the steady clock, which the processes of one
/// machine share, so the traces of a job's processes line up when merged.
std::string traceEventsJson(int pid, const std::string& process);

/// Merges trace documents (each one traceEventsJson) into one; throws naming a malformed one.
std::string mergeTraces(const std::vector<std::string>& documents);

}  // namespace weft
