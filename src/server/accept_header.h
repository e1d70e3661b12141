// What a request's Accept header asks for: the one question the server puts to it, whether a
// browser is asking for a page. Pure (no sockets), fuzzed with the request-head parser.
#pragma once
#include "server/http_parse.h"

namespace sluice::server {

// True when the request's Accept names text/html with a non-zero quality: a browser's
// navigation. API clients (and Claude Code's HEAD /) name JSON or nothing and keep getting the
// JSON list of endpoints.
bool accepts_html(const HttpRequest& req);

}  // namespace sluice::server
