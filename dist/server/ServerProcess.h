// A parameter-server process: the loop that moves its messages between the transport, its
// ParameterServer (the owner of partitions) and its LocalAggregator (its machine's workers'
// sender). The protocol's rules live in those two state machines, which do no I/O; this is the
// I/O around them.
#pragma once

#include "core/Graph.h"
#include "dist/Config.h"
#include "dist/launch/Job.h"
#include "dist/server/ParameterServer.h"

#include <chrono>
#include <map>
#include <string>

namespace weft::dist {

/// Pushes and pulls that crossed between machines through one server process (as owner or as
/// local aggregator): payload and header bytes, and the steps they span.
struct ServerTraffic {
  uint64_t sent = 0, received = 0;
  int64_t steps = 0;
  std::map<std::string, SparseRows> aggregatedRows;  ///< what the local aggregator merged
  std::vector<SenderStaleness> staleness;             ///< by worker, under the asynchronous modes
};

/// Serves on `transport` until every sender has said goodbye and the local aggregator (null
/// when this server aggregates for no machine) has taken its workers' goodbyes to every server,
/// then closes the connections. A message that is not a valid request (or reply to a forwarded
/// one) is logged, naming `who`, and dropped; a dead worker or server it still depends on, or a
/// send that does not complete within `timeout`, throws.
ServerTraffic serve(ParameterServer& server, LocalAggregator* aggregator, Transport& transport,
                    const PeerRoutes& routes, const std::string& who, std::chrono::milliseconds timeout);

/// Runs this process as the server it is in `job`: holds its partitions of the variables that
/// `graph` (the single-device training graph, as every process of the job builds it) puts on the
/// servers and aggregates for its machine's workers, until every worker has left. Returns the
/// process's exit status: 0, or 1 after an error, which it prints naming this server (and then
/// closes its connections, so the workers waiting on it stop at once).
int serveJob(JobContext& job, const Graph& graph, const Config& config);

}  // namespace weft::dist
