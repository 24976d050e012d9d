// A message between the processes of a job as a transport's active messages carry it: a header
// (whose layout the protocol fixes, dist/server/ServerProtocol.h), a payload, and the peer it came from
// as the transport established it (a sealed sender, dist/transport/Seal.h), never as the header claims.
#pragma once

#include <cstdint>
#include <vector>

namespace weft::dist {

/// An endpoint's name in its job (dist/transport/Seal.h: endpointName).
using EndpointName = uint64_t;

struct Message {
  std::vector<uint8_t> header;
  std::vector<uint8_t> payload;
  int from = -1;  ///< the sender's peer index on the receiving transport; -1 when not known
};

}  // namespace weft::dist
