// Following a queued job from the handler thread to its end — token ids to UTF-8-safe text
// (text::OutputDecoder) to reasoning / content / tool-call deltas (text::OutputParser), stop
// strings matched in the content — while watching the client and keeping the stream alive; and
// the one log line per request.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/session.h"
#include "server/context.h"
#include "server/http.h"
#include "server/max_tokens.h"
#include "text/deepseek41/dsml.h"

namespace sluice::server {

// What the per-request log line says about a request besides its outcome.
struct RequestInfo {
  std::string endpoint;   // the path
  size_t body_bytes = 0;
  size_t tools = 0;
  MaxTokens max_tokens;
};

struct DriveHooks {
  // Called when nothing was written for the ping interval (waiting or prefilling); streams
  // write a keep-alive. Return false when the write failed.
  std::function<bool()> keepalive;
  // Called once, when the worker has taken the job and knows how many prompt tokens it reuses
  // (the first prefill report), before `prefill`. Anthropic's message_start waits for it, since
  // its usage carries cache_read_input_tokens.
  std::function<bool(uint32_t reused)> started;
  std::function<bool(uint32_t done, uint32_t total)> prefill;
  std::function<bool(const text::OutputParser::Delta&)> delta;
  std::vector<std::string> stops;  // stop strings matched in the content (server/stop_strings.h)
  // For the one-line log drive() writes when the job ends (every endpoint, every outcome).
  RequestInfo info;
};

struct DriveOutcome {
  bool ok = false;           // false: failed (status, error) or the client left
  bool client_gone = false;
  int status = 500;
  std::string error;
  GenerateResult result;
  bool had_calls = false;    // some delta carried tool calls
  std::string stop_string;   // the stop string that ended generation, if one did
  double ttft_s = -1;        // from drive()'s start (the job just queued) to the first token; -1: none
};

enum class TextMode {
  Raw,       // completions: all text is content, no tool-call parsing
  Chat,      // chat without thinking: content and DSML tool calls
  Thinking,  // chat with thinking: reasoning up to </think>, then as Chat
};

// Follows the job to its end and logs one line (hooks.info, prompt and cached tokens, time to
// first token, generated tokens, finish). Stop tokens and eos never reach the text. When the client
// disconnects (or a hook reports a failed write) the job is cancelled and this returns at once.
DriveOutcome drive(ServerContext& ctx, Job& job, Connection& conn, TextMode mode, const DriveHooks& hooks);

// "length" for the length and context limits, else the Session's finish.
std::string finish_reason(const DriveOutcome& o);

}  // namespace sluice::server
