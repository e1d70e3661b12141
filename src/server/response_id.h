// Ids for responses and tool calls.
#pragma once
#include <string>

#include "server/context.h"

namespace sluice::server {

// A fresh id with a prefix: "chatcmpl-1a2b", "msg_...". A counter keeps ids unique within the
// process; the random part keeps them from repeating across restarts.
std::string new_id(ServerContext& ctx, const char* prefix);

}  // namespace sluice::server
