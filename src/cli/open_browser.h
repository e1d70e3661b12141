// `serve --open`: the chat page in the user's browser, through the desktop's own opener.
#pragma once
#include <string>

namespace sluice::cli {

// Starts `xdg-open URL` (found on PATH; no shell, the URL one argument) without waiting for it,
// and reaps it in the background. Returns "" when it started, else why not (no xdg-open: a
// machine without a desktop), for the caller to print beside the URL.
std::string open_in_browser(const std::string& url);

}  // namespace sluice::cli
