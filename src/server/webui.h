// The chat page `serve` shows a browser at / (src/server/chat_page.html, embedded at build time).
#pragma once
#include <string>
#include <string_view>

#include "server/accept_header.h"
#include "server/http.h"
#include "server/http_parse.h"

namespace sluice::server {

// The page as it is in the repository.
std::string_view chat_page();

// Answers GET or HEAD / with the page. Its scripts and styles run only with this response's
// nonce (Content-Security-Policy): markup that reached the document some other way (a model's
// answer, a stored conversation) could not run even if the page rendered it as HTML, which it
// does not. The page may talk only to this server.
int handle_chat_page(const HttpRequest& req, Connection& conn);

// The page with every <script> and <style> tag given the nonce (for the tests).
std::string page_with_nonce(std::string_view page, const std::string& nonce);

}  // namespace sluice::server
