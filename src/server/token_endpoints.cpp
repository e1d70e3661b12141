#include "server/token_endpoints.h"

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/request_body.h"
#include "server/request_json.h"
#include "server/worker_access.h"
#include "text/json_text.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace sluice::server {

using nlohmann::json;

namespace {

// Output is written in pieces of about this size: memory for the response stays this, not the
// whole (~25 bytes per token) body.
constexpr size_t kWriteChunk = 256 * 1024;

// Sends `out` as the whole response when it is small and `last`; otherwise starts a response
// without Content-Length (the body ends with the connection) and writes what is buffered.
class ChunkedJson {
 public:
  explicit ChunkedJson(Connection& c) : conn_(c) {}
  std::string& buf() { return buf_; }
  // Call after appending; writes out when the buffer is full. false: the client is gone.
  bool flush_if_full() {
    if (buf_.size() < kWriteChunk) return true;
    if (!started_) {
      send_stream_head(conn_, 200, "application/json");
      started_ = true;
    }
    const bool ok = conn_.write(buf_);
    buf_.clear();
    return ok;
  }
  void finish() {
    if (!started_) {
      send_response(conn_, 200, "application/json", buf_);
    } else {
      conn_.write(buf_);
    }
    buf_.clear();
  }

 private:
  Connection& conn_;
  std::string buf_;
  bool started_ = false;
};

}  // namespace

// A place is given back when its handler returns, after the answer was written: a client that
// reads the answer and sends its next request at once can find its own last place still held.
// So a request waits a moment (kTokenSlotWait) for a place before it is refused.
TokenRequestSlot::TokenRequestSlot(ServerContext& ctx) : ctx_(ctx) {
  std::unique_lock lk(ctx_.token_mu);
  if (!ctx_.token_cv.wait_for(lk, kTokenSlotWait, [&] { return ctx_.token_requests < ctx_.opts.max_token_requests; })) {
    ApiError e(503, "unavailable_error",
               "the server is busy: " + std::to_string(ctx_.opts.max_token_requests) +
                   " tokenize / detokenize / count_tokens requests are already running; retry later");
    e.retry_after = 1;
    e.refusal = "token_slots";
    throw e;
  }
  ++ctx_.token_requests;
}

TokenRequestSlot::~TokenRequestSlot() {
  {
    std::lock_guard lk(ctx_.token_mu);
    --ctx_.token_requests;
  }
  ctx_.token_cv.notify_one();
}

// {"content", "add_special" (false), "parse_special" (true), "with_pieces"}.
int handle_tokenize(ServerContext& ctx, const HttpRequest& req, Connection& conn) {
  const TokenRequestSlot slot(ctx);
  const json body = parse_charged_body(ctx, req, conn, kTextWorkPerByte);
  const text::Tokenizer& tok = ready_session(ctx).tokenizer();
  const auto it = body.find("content");
  if (it == body.end() || !it->is_string()) throw bad_request("'content' (a string) is required");
  const bool add_special = get_bool(body, "add_special").value_or(false);
  const bool parse_special = get_bool(body, "parse_special").value_or(true);
  const bool with_pieces = get_bool(body, "with_pieces").value_or(false);
  const std::vector<TokenId> ids = tok.encode(it->get_ref<const std::string&>(), add_special, parse_special);
  ChunkedJson out(conn);
  std::string& b = out.buf();
  b.reserve(kWriteChunk + 4096);
  b += "{\"tokens\":[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) b += ',';
    if (!with_pieces) {
      b += std::to_string(ids[i]);
    } else {
      // The piece as a string when it is UTF-8, else as its byte values.
      const std::string_view piece = tok.token_to_piece(ids[i]);
      b += "{\"id\":" + std::to_string(ids[i]) + ",\"piece\":";
      if (text::utf8_valid(piece)) {
        b += text::py_json_string(piece);
      } else {
        b += '[';
        for (size_t k = 0; k < piece.size(); ++k) {
          if (k) b += ',';
          b += std::to_string((unsigned char)piece[k]);
        }
        b += ']';
      }
      b += '}';
    }
    if (!out.flush_if_full()) return 499;
  }
  b += "]}";
  out.finish();
  return 200;
}

// The answer is written as it is decoded, in pieces of kWriteChunk: an id list of long tokens
// decodes to many times its size, which is never held whole.
int handle_detokenize(ServerContext& ctx, const HttpRequest& req, Connection& conn) {
  const TokenRequestSlot slot(ctx);
  const json body = parse_charged_body(ctx, req, conn, kIdsWorkPerByte, kAnswerBufferBytes);
  const text::Tokenizer& tok = ready_session(ctx).tokenizer();
  if (!body.contains("tokens") || !body["tokens"].is_array()) throw bad_request("'tokens' (an array of ids) is required");
  std::vector<TokenId> ids;
  ids.reserve(body["tokens"].size());
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab())
      throw bad_request("'tokens' must hold ids in [0, " + std::to_string(tok.n_vocab()) + ")");
    ids.push_back(t.get<TokenId>());
  }
  ChunkedJson out(conn);
  std::string& b = out.buf();
  b.reserve(kWriteChunk + 4096);
  b += "{\"content\":\"";
  // Whole characters at a time (StreamDecoder), escaped as the whole string would be.
  auto put = [&b](const std::string& text) {
    if (text.empty()) return;
    const std::string quoted = text::py_json_string(text);
    b.append(quoted, 1, quoted.size() - 2);
  };
  text::StreamDecoder dec(tok);
  for (const TokenId id : ids) {
    put(dec.push(id));
    if (!out.flush_if_full()) return 499;
  }
  put(dec.finish());
  b += "\"}";
  out.finish();
  return 200;
}

}  // namespace sluice::server
