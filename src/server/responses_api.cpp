#include "server/responses_api.h"

#include <cstdio>
#include <ctime>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/openai_api.h"
#include "server/responses_request.h"
#include "server/sse.h"

namespace sluice::server {

using nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Each kind of dropped thing is logged once per process: an agent sends the same built-in tool
// with every request. The kinds come from fixed lists (responses_request.cpp), so this is bounded.
void log_dropped(const std::vector<ResponsesRequest::Dropped>& dropped) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard lk(mu);
  for (const auto& d : dropped)
    if (seen.insert(d.what).second)
      std::fprintf(stderr,
                   "sluice serve: /v1/responses: left out %s (%s): sluice runs no built-in tools and the model "
                   "reads text only (logged once per kind)\n",
                   d.what.c_str(), d.where.c_str());
}

// One response: its id, the request's echoed settings, and the output items as they complete.
struct Response {
  ServerContext& ctx;
  const ResponsesRequest& rr;
  std::string id;
  int64_t created = 0;
  json output = json::array();

  json object(const char* status) const {
    const SamplingFields& s = rr.chat.sampling;
    return {{"id", id},
            {"object", "response"},
            {"created_at", created},
            {"status", status},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"instructions", rr.instructions},
            {"max_output_tokens", rr.max_output_tokens ? json(*rr.max_output_tokens) : json(nullptr)},
            {"model", ctx.model_id},
            {"output", output},
            {"parallel_tool_calls", rr.parallel_tool_calls},
            {"previous_response_id", nullptr},
            {"reasoning", rr.reasoning},
            {"store", false},
            {"temperature", s.temperature.value_or(ctx.opts.temp)},
            {"top_p", s.top_p.value_or(ctx.opts.top_p)},
            {"text", {{"format", rr.text_format}}},
            {"tool_choice", rr.tool_choice},
            {"tools", rr.tools},
            {"truncation", "disabled"},
            {"usage", nullptr},
            {"metadata", rr.metadata}};
  }

  // A call of a namespaced tool goes back under its own name with its namespace.
  json call_item(const text::ToolCall& c, const std::string& item_id, const std::string& call_id, const char* status) const {
    json item = {{"id", item_id}, {"type", "function_call"}, {"status", status}, {"call_id", call_id},
                 {"name", c.name}, {"arguments", c.arguments}};
    const auto it = rr.namespaced.find(c.name);
    if (it != rr.namespaced.end()) {
      item["namespace"] = it->second.first;
      item["name"] = it->second.second;
    }
    return item;
  }
};

json usage_json(const GenerateResult& r, uint64_t reasoning_tokens) {
  const uint64_t out = r.tokens.size();
  return {{"input_tokens", r.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", r.reused_tokens}}},
          {"output_tokens", out},
          {"output_tokens_details", {{"reasoning_tokens", std::min(reasoning_tokens, out)}}},
          {"total_tokens", r.prompt_tokens + out}};
}

// The worker reports tokens, the parser text: the reasoning's share is counted by tokenizing it
// again (plus the </think> that closed it), which matches the generated count for text the
// model's own tokenizer produced.
uint64_t count_reasoning_tokens(const Session& s, const std::string& reasoning, bool closed) {
  if (reasoning.empty()) return 0;
  return s.tokenizer().encode(reasoning, false, false).size() + (closed ? 1 : 0);
}

// Incomplete only for limits the client (or nobody) chose: its own max_output_tokens, or the
// context filling up. A response ended by the server's --max-tokens-limit is complete: that is
// the operator's cap on every answer (docs/server.md).
bool incomplete(const DriveOutcome& o, const ResponsesRequest& rr) {
  if (o.result.finish == "context") return true;
  return o.result.finish == "length" && rr.max_output_tokens && (int64_t)o.result.tokens.size() >= *rr.max_output_tokens;
}

json error_json(const DriveOutcome& o) {
  const char* code = o.status == 503 ? "server_is_overloaded" : o.status == 400 ? "invalid_request_error" : "server_error";
  return {{"code", code}, {"message", o.error}};
}

std::string context_message(size_t n, uint32_t n_ctx) {
  return "the prompt has " + std::to_string(n) + " tokens but the context holds " + std::to_string(n_ctx) +
         " (start the server with a larger -c, or shorten the input)";
}

// The typed event stream. Items open when their first text arrives and close when another kind
// of output starts or the generation ends.
struct EventWriter {
  explicit EventWriter(Response& r) : resp(r) {}
  Response& resp;
  uint64_t seq = 0;
  std::string open;  // "", "reasoning", "message"
  std::string item_id, text;
  std::string all_reasoning;
  bool reasoning_closed = false;

  std::string event(json j) {
    const std::string type = j["type"];
    j["sequence_number"] = seq++;
    return sse_event(type, j);
  }
  size_t index() const { return resp.output.size(); }

  std::string close() {
    std::string out;
    if (open.empty()) return out;
    const bool reasoning = open == "reasoning";
    const char* part_type = reasoning ? "reasoning_text" : "output_text";
    json part = {{"type", part_type}, {"text", text}};
    if (!reasoning) part["annotations"] = json::array();
    json done = {{"type", reasoning ? "response.reasoning_text.done" : "response.output_text.done"},
                 {"item_id", item_id}, {"output_index", index()}, {"content_index", 0}, {"text", text}};
    if (!reasoning) done["logprobs"] = json::array();
    out += event(std::move(done));
    out += event({{"type", "response.content_part.done"}, {"item_id", item_id}, {"output_index", index()},
                  {"content_index", 0}, {"part", part}});
    json item = reasoning ? json{{"id", item_id}, {"type", "reasoning"}, {"status", "completed"},
                                 {"summary", json::array()}, {"content", json::array({part})}, {"encrypted_content", nullptr}}
                          : json{{"id", item_id}, {"type", "message"}, {"status", "completed"}, {"role", "assistant"},
                                 {"content", json::array({part})}};
    out += event({{"type", "response.output_item.done"}, {"output_index", index()}, {"item", item}});
    resp.output.push_back(std::move(item));
    if (reasoning) reasoning_closed = true;
    open.clear();
    text.clear();
    return out;
  }

  std::string append(const std::string& kind, const std::string& delta) {
    std::string out;
    if (open != kind) {
      out += close();
      open = kind;
      const bool reasoning = kind == "reasoning";
      item_id = new_id(resp.ctx, reasoning ? "rs_" : "msg_");
      const json item = reasoning ? json{{"id", item_id}, {"type", "reasoning"}, {"status", "in_progress"},
                                         {"summary", json::array()}, {"content", json::array()}}
                                  : json{{"id", item_id}, {"type", "message"}, {"status", "in_progress"},
                                         {"role", "assistant"}, {"content", json::array()}};
      out += event({{"type", "response.output_item.added"}, {"output_index", index()}, {"item", item}});
      json part = {{"type", reasoning ? "reasoning_text" : "output_text"}, {"text", ""}};
      if (!reasoning) part["annotations"] = json::array();
      out += event({{"type", "response.content_part.added"}, {"item_id", item_id}, {"output_index", index()},
                    {"content_index", 0}, {"part", part}});
    }
    text += delta;
    if (kind == "reasoning") all_reasoning += delta;
    json d = {{"type", kind == "reasoning" ? "response.reasoning_text.delta" : "response.output_text.delta"},
              {"item_id", item_id}, {"output_index", index()}, {"content_index", 0}, {"delta", delta}};
    if (kind != "reasoning") d["logprobs"] = json::array();
    out += event(std::move(d));
    return out;
  }

  std::string call(const text::ToolCall& c) {
    std::string out = close();
    const std::string fc_id = new_id(resp.ctx, "fc_"), call_id = new_id(resp.ctx, "call_");
    json added = resp.call_item(c, fc_id, call_id, "in_progress");
    added["arguments"] = "";
    out += event({{"type", "response.output_item.added"}, {"output_index", index()}, {"item", added}});
    out += event({{"type", "response.function_call_arguments.delta"}, {"item_id", fc_id}, {"output_index", index()},
                  {"delta", c.arguments}});
    out += event({{"type", "response.function_call_arguments.done"}, {"item_id", fc_id}, {"output_index", index()},
                  {"arguments", c.arguments}});
    json item = resp.call_item(c, fc_id, call_id, "completed");
    out += event({{"type", "response.output_item.done"}, {"output_index", index()}, {"item", item}});
    resp.output.push_back(std::move(item));
    return out;
  }
};

}  // namespace

int handle_responses(ServerContext& ctx, const HttpRequest& req, Connection& conn) {
  const json body = parse_body(req.body, ctx.opts.max_json_depth);
  const ResponsesRequest rr = responses_request(body, ctx.opts.max_json_depth);
  log_dropped(rr.dropped);
  const ChatRequest& cr = rr.chat;
  const Session& s = ready_session(ctx);
  std::string prompt_text;
  std::vector<uint32_t> prompt = encode_chat(s, cr.messages, cr.options, &prompt_text);
  const size_t n_prompt = prompt.size();
  Response resp{ctx, rr, new_id(ctx, "resp_"), (int64_t)std::time(nullptr), json::array()};
  const TextMode mode = cr.options.thinking ? TextMode::Thinking : TextMode::Chat;

  // A prompt the context cannot hold: the API's own code, which agents act on (Codex compacts
  // its history on context_length_exceeded instead of retrying).
  const bool too_long = n_prompt >= s.ctx();
  if (too_long && !cr.stream) {
    const json err = {{"error", {{"message", context_message(n_prompt, s.ctx())}, {"type", "invalid_request_error"},
                                 {"param", "input"}, {"code", "context_length_exceeded"}}}};
    send_response(conn, 400, "application/json", dump(err));
    return 400;
  }
  std::shared_ptr<Job> job;
  if (!too_long) {
    GenerateRequest gr = make_request(ctx, std::move(prompt), cr.max_tokens, cr.sampling, chat_stop_tokens(s.tokenizer()));
    gr.prompt_text = std::move(prompt_text);
    job = submit(ctx, std::move(gr));
  }

  if (cr.stream) {
    send_stream_head(conn, 200, "text/event-stream");
    EventWriter w(resp);
    // First bytes at once, before the queue wait and the prefill.
    std::string head = sse_comment("sluice " + resp.id);
    head += w.event({{"type", "response.created"}, {"response", resp.object("in_progress")}});
    head += w.event({{"type", "response.in_progress"}, {"response", resp.object("in_progress")}});
    conn.write(head);
    auto fail = [&](const json& error) {
      json r = resp.object("failed");
      r["error"] = error;
      conn.write(w.event({{"type", "response.failed"}, {"response", r}}));
    };
    if (too_long) {
      fail({{"code", "context_length_exceeded"}, {"message", context_message(n_prompt, s.ctx())}});
      return 400;
    }
    DriveHooks h;
    h.keepalive = [&] { return conn.write(sse_comment("keep-alive")); };
    h.prefill = [&](uint32_t done, uint32_t total) {
      return conn.write(sse_comment("prefill " + std::to_string(done) + "/" + std::to_string(total)));
    };
    h.delta = [&](const text::OutputParser::Delta& d) {
      std::string out;
      if (!d.reasoning.empty()) out += w.append("reasoning", d.reasoning);
      if (!d.content.empty()) out += w.append("message", d.content);
      for (const auto& c : d.calls) out += w.call(c);
      return conn.write(out);
    };
    const DriveOutcome o = drive(ctx, *job, conn, mode, h);
    if (o.client_gone) return 499;
    std::string out = w.close();
    if (!o.ok) {
      conn.write(out);
      fail(error_json(o));
      return o.status;
    }
    const bool inc = incomplete(o, rr);
    json r = resp.object(inc ? "incomplete" : "completed");
    if (inc) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    r["usage"] = usage_json(o.result, count_reasoning_tokens(s, w.all_reasoning, w.reasoning_closed));
    out += w.event({{"type", inc ? "response.incomplete" : "response.completed"}, {"response", r}});
    conn.write(out);
    return 200;
  }

  std::string reasoning;
  // Items in the order the model produced them: reasoning, text, calls may interleave.
  json output = json::array();
  std::string last;  // kind of output.back(): "reasoning", "message", "call"
  bool reasoning_closed = false;
  auto text_item = [&](const std::string& kind, const std::string& t) {
    if (last != kind) {
      if (last == "reasoning") reasoning_closed = true;
      last = kind;
      json part = {{"type", kind == "reasoning" ? "reasoning_text" : "output_text"}, {"text", ""}};
      if (kind != "reasoning") part["annotations"] = json::array();
      output.push_back(kind == "reasoning"
                           ? json{{"id", new_id(ctx, "rs_")}, {"type", "reasoning"}, {"status", "completed"},
                                  {"summary", json::array()}, {"content", json::array({part})}, {"encrypted_content", nullptr}}
                           : json{{"id", new_id(ctx, "msg_")}, {"type", "message"}, {"status", "completed"},
                                  {"role", "assistant"}, {"content", json::array({part})}});
    }
    json& p = output.back()["content"][0];
    p["text"] = p["text"].get<std::string>() + t;
  };
  DriveHooks h;
  h.delta = [&](const text::OutputParser::Delta& d) {
    if (!d.reasoning.empty()) {
      text_item("reasoning", d.reasoning);
      reasoning += d.reasoning;
    }
    if (!d.content.empty()) text_item("message", d.content);
    for (const auto& c : d.calls) {
      if (last == "reasoning") reasoning_closed = true;
      last = "call";
      output.push_back(resp.call_item(c, new_id(ctx, "fc_"), new_id(ctx, "call_"), "completed"));
    }
    return true;
  };
  const DriveOutcome o = drive(ctx, *job, conn, mode, h);
  if (o.client_gone) {
    conn.keep_alive = false;
    return 499;
  }
  if (!o.ok) throw ApiError(o.status, o.status == 400 ? "invalid_request_error" : "server_error", o.error);
  resp.output = std::move(output);
  const bool inc = incomplete(o, rr);
  json r = resp.object(inc ? "incomplete" : "completed");
  if (inc) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["usage"] = usage_json(o.result, count_reasoning_tokens(s, reasoning, reasoning_closed));
  send_response(conn, 200, "application/json", dump(r));
  return 200;
}

}  // namespace sluice::server
