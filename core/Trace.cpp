// The process's trace (see the header).
#include "core/Trace.h"

#include "core/Error.h"
#include "core/JsonLimits.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

namespace weft {

namespace {

struct Event {
  std::string name;
  std::string category;
  const char* track;
  int64_t start, duration;  // microseconds
  int64_t bytes;             // -1: none
};

std::atomic<bool> recording{false};
std::mutex eventsMutex;
std::vector<Event> events;

int64_t microseconds(TraceClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

void startTracing() {
  std::lock_guard lock(eventsMutex);
  events.clear();
  recording = true;
}

void stopTracing() { recording = false; }

bool tracing() { return recording.load(std::memory_order_relaxed); }

void traceEvent(const std::string& name, const std::string& category, const char* track,
                TraceClock::time_point start, TraceClock::time_point end, int64_t bytes) {
  if (!tracing()) return;
  const int64_t begin = microseconds(start);
  std::lock_guard lock(eventsMutex);
  events.push_back({name, category, track, begin, std::max<int64_t>(microseconds(end) - begin, 0), bytes});
}

TraceScope::TraceScope(std::string name, std::string category, const char* track)
    : name_(std::move(name)), category_(std::move(category)), track_(track),
      start_(tracing() ? TraceClock::now() : TraceClock::time_point{}) {}

TraceScope::~TraceScope() {
  if (tracing()) traceEvent(name_, category_, track_, start_, TraceClock::now());
}

std::string traceEventsJson(int pid, const std::string& process) {
  std::lock_guard lock(eventsMutex);
  nlohmann::json list = nlohmann::json::array();
  list.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", process}}}});
  list.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  std::map<std::string, int> tracks;  // a thread id per track, named once
  for (const Event& e : events) {
    auto [it, added] = tracks.try_emplace(e.track, static_cast<int>(tracks.size()) + 1);
    if (added) {
      list.push_back(
          {{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", it->second}, {"args", {{"name", e.track}}}});
    }
    nlohmann::json event{{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"pid", pid}, {"tid", it->second},
                         {"ts", e.start}, {"dur", e.duration}};
    if (e.bytes >= 0) event["args"] = {{"bytes", e.bytes}};
    list.push_back(std::move(event));
  }
  return nlohmann::json{{"traceEvents", std::move(list)}, {"displayTimeUnit", "ms"}}.dump();
}

std::string mergeTraces(const std::vector<std::string>& documents) {
  nlohmann::json all = nlohmann::json::array();
  for (size_t i = 0; i < documents.size(); ++i) {
    WEFT_CHECK(!jsonNestingBeyond(documents[i], kMaxJsonDepth), "trace {} of {} nests deeper than {} levels", i + 1,
               documents.size(), kMaxJsonDepth);
    const nlohmann::json doc = nlohmann::json::parse(documents[i], nullptr, false);
    WEFT_CHECK(doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array(),
               "trace {} of {} is not a trace-event document", i + 1, documents.size());
    for (const nlohmann::json& e : doc["traceEvents"]) all.push_back(e);
  }
  return nlohmann::json{{"traceEvents", std::move(all)}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace weft
