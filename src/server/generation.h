// The part of a completion request every API shares: turning request fields into a
// GenerateRequest with the server's bounds, putting it in the queue, and following the job from
// the handler thread — token ids to UTF-8-safe text (StreamDecoder) to reasoning / content /
// tool-call deltas (OutputParser) — while watching the client and keeping the stream alive.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/session.h"
#include "server/chat_request.h"
#include "server/context.h"
#include "server/request_json.h"
#include "server/http.h"
#include "text/deepseek41/chat.h"
#include "text/deepseek41/dsml.h"
#include "text/tokenizer.h"

namespace sluice::server {

// The loaded session, or ApiError 503 ("loading" / "failed to load").
const Session& ready_session(ServerContext& ctx);

// How many tokens a request may generate. Agents ask for far more than a local server allows
// (Claude Code 32000-128000, opencode 32000), so a larger value is capped, not refused: by
// --max-tokens-limit, then by the context left after the prompt. The value itself was checked
// (an integer >= 1) with the sampling fields; every endpoint's max_tokens goes through here.
struct MaxTokens {
  std::optional<int64_t> requested;  // as the request said (absent: the limit is the default)
  uint32_t effective = 0;
  const char* capped_by = nullptr;   // "--max-tokens-limit", "context", or null when not capped
};
MaxTokens clamp_max_tokens(std::optional<int64_t> requested, uint32_t limit, uint32_t room);

// Response headers that report the effective value: X-Max-Tokens (and X-Max-Tokens-Capped-By
// with the reason when it is less than the request asked for).
std::vector<std::string> max_tokens_headers(const MaxTokens& m);

// What the per-request log line says about a request besides its outcome.
struct RequestInfo {
  std::string endpoint;   // the path
  size_t body_bytes = 0;
  size_t tools = 0;
  MaxTokens max_tokens;
};

// The server's own settings over a chat request: --stop strings join the request's, and
// --thinking off turns thinking off. Every chat endpoint calls it after converting its body.
void apply_server_defaults(const ServerContext& ctx, ChatRequest& r);

// Logs once, on stderr, the parts a request had that the model cannot read (placeholders).
void log_omitted(const std::string& endpoint, const std::vector<std::string>& omitted);

// Checks the prompt against the context (ApiError 400 with the numbers), clamps max_tokens
// (clamp_max_tokens; *max_out gets the outcome) and fills in defaults.
GenerateRequest make_request(ServerContext& ctx, std::vector<uint32_t> prompt, std::optional<int64_t> max_tokens,
                             const SamplingFields& sampling, std::vector<uint32_t> stop_tokens,
                             MaxTokens* max_out = nullptr);

// Queues the request; ApiError 503 with Retry-After when the queue is full.
std::shared_ptr<Job> submit(ServerContext& ctx, GenerateRequest r);

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

// A fresh id with a prefix: "chatcmpl-1a2b", "msg_...".
std::string new_id(ServerContext& ctx, const char* prefix);

}  // namespace sluice::server

namespace sluice::server {

// Renders a chat with text::render_chat (ApiError 400 on what it rejects) and tokenizes it
// with Session::tokenize_prompt; the rendered text goes to *text_out (for prompt_text).
std::vector<uint32_t> encode_chat(const Session& s, const std::vector<text::ChatMessage>& messages,
                                  const text::ChatOptions& options, std::string* text_out = nullptr);
// Tokens that end a chat turn besides eos: the model opening a new user turn.
std::vector<uint32_t> chat_stop_tokens(const text::Tokenizer& tok);
std::vector<uint32_t> to_ids(const std::vector<int32_t>& v);

}  // namespace sluice::server
