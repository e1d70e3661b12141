#include "server/generation.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <random>

#include "model/architecture.h"
#include "runtime/sampler.h"
#include "server/api_error.h"
#include "server/stop_strings.h"
#include "text/output_text.h"
#include "util/error.h"

namespace sluice::server {

using nlohmann::json;

const Session& ready_session(ServerContext& ctx) {
  switch (ctx.worker.state()) {
    case Worker::State::Ready: return *ctx.worker.session();
    case Worker::State::Loading: {
      ApiError e(503, "unavailable_error", "Loading model");
      e.retry_after = 5;
      throw e;
    }
    default: throw ApiError(503, "unavailable_error", "the model is not available: " + ctx.worker.load_error());
  }
}

MaxTokens clamp_max_tokens(std::optional<int64_t> requested, uint32_t limit, uint32_t room) {
  MaxTokens m;
  m.requested = requested;
  uint64_t want = requested ? (uint64_t)std::max<int64_t>(*requested, 0) : limit;
  if (want > limit) {
    want = limit;
    m.capped_by = "--max-tokens-limit";
  }
  if (want > room) {
    want = room;
    m.capped_by = "context";
  }
  m.effective = (uint32_t)want;
  return m;
}

std::vector<std::string> max_tokens_headers(const MaxTokens& m) {
  std::vector<std::string> h = {"X-Max-Tokens: " + std::to_string(m.effective)};
  if (m.capped_by) h.push_back(std::string("X-Max-Tokens-Capped-By: ") + m.capped_by);
  return h;
}

void apply_server_defaults(const ServerContext& ctx, ChatRequest& r) {
  for (const std::string& s : ctx.opts.stops)
    if (std::find(r.stops.begin(), r.stops.end(), s) == r.stops.end()) r.stops.push_back(s);
  if (ctx.opts.thinking_off) {
    r.options.thinking = false;
    r.options.reasoning_effort = 0;
  }
}

void log_omitted(const std::string& endpoint, const std::vector<std::string>& omitted) {
  if (omitted.empty()) return;
  std::string list;
  for (const std::string& o : omitted) list += (list.empty() ? "" : "; ") + o;
  std::fprintf(stderr, "sluice serve: %s: %zu part(s) replaced by a text placeholder (the model reads text only): %s\n",
               endpoint.c_str(), omitted.size(), list.c_str());
}

GenerateRequest make_request(ServerContext& ctx, std::vector<uint32_t> prompt, std::optional<int64_t> max_tokens,
                             const SamplingFields& sampling, std::vector<uint32_t> stop_tokens, MaxTokens* max_out) {
  const Session& s = ready_session(ctx);
  const uint32_t n_ctx = s.ctx();
  if (prompt.empty()) throw bad_request("the prompt is empty");
  if (prompt.size() >= n_ctx)
    throw bad_request("the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds " +
                      std::to_string(n_ctx) + " (start the server with a larger -c, or shorten the prompt)");
  GenerateRequest r;
  const MaxTokens m = clamp_max_tokens(max_tokens, ctx.opts.max_tokens_limit, n_ctx - (uint32_t)prompt.size());
  r.max_tokens = m.effective;
  if (max_out) *max_out = m;
  r.prompt = std::move(prompt);
  r.stop_tokens = std::move(stop_tokens);
  r.sampling.temp = (float)sampling.temperature.value_or(ctx.opts.temp);
  r.sampling.top_p = (float)sampling.top_p.value_or(ctx.opts.top_p);
  r.sampling.top_k = (uint32_t)sampling.top_k.value_or(ctx.opts.top_k);
  r.sampling.min_p = (float)sampling.min_p.value_or(ctx.opts.min_p);
  if (sampling.seed) {
    r.sampling.seed = *sampling.seed;
  } else {
    static thread_local std::mt19937_64 seeder{std::random_device{}()};
    r.sampling.seed = seeder();
  }
  try {
    validate(r.sampling);
  } catch (const Error& e) {
    throw bad_request(e.what());
  }
  return r;
}

std::shared_ptr<Job> submit(ServerContext& ctx, GenerateRequest r) {
  auto job = std::make_shared<Job>(std::move(r));
  if (!ctx.worker.submit(job)) {
    ready_session(ctx);  // 503 "loading" rather than "full" while the model loads
    ApiError e(503, "unavailable_error",
               "the server is busy: " + std::to_string(ctx.opts.queue_depth) +
                   " requests are already waiting (--queue); retry later");
    e.retry_after = ctx.opts.retry_after_s;
    throw e;
  }
  return job;
}

namespace {

DriveOutcome drive_job(ServerContext& ctx, Job& job, Connection& conn, TextMode mode, const DriveHooks& hooks) {
  const auto start = std::chrono::steady_clock::now();
  const Session& s = *ctx.worker.session();
  const text::Tokenizer& tok = s.tokenizer();
  const bool raw = mode == TextMode::Raw;
  text::OutputDecoder dec(tok, raw ? text::OutputMode::Plain : text::OutputMode::Chat);
  text::OutputParser parser(mode == TextMode::Thinking);
  DriveOutcome out;
  const auto ping = std::chrono::milliseconds(std::max(50, ctx.opts.ping_interval_ms));
  auto last_write = std::chrono::steady_clock::now();
  std::vector<JobEvent> events;

  auto hidden = [&](uint32_t id) {
    if ((int32_t)id == tok.eos() || (int32_t)id == tok.bos()) return true;
    for (uint32_t t : job.request.stop_tokens)
      if (t == id) return true;
    return false;
  };
  StopMatcher stopper(hooks.stops);
  auto emit = [&](text::OutputParser::Delta d) {
    if (stopper.active() && !d.content.empty()) {
      d.content = stopper.push(d.content);
      if (stopper.hit()) job.cancel(CancelCause::StopString);  // the worker stops at the next token
    }
    if (d.empty()) return true;
    if (!d.calls.empty()) out.had_calls = true;
    last_write = std::chrono::steady_clock::now();
    return !hooks.delta || hooks.delta(d);
  };

  auto raw_delta = [](const std::string& text) {
    text::OutputParser::Delta d;
    d.content = text;
    return d;
  };
  bool gone = false;
  bool started = false;
  while (!gone) {
    events.clear();
    job.wait(events, std::min(ping, std::chrono::milliseconds(200)));
    for (JobEvent& e : events) {
      switch (e.kind) {
        case JobEvent::Kind::Started: break;
        case JobEvent::Kind::Prefill:
          if (!started) {
            started = true;
            if (hooks.started && !hooks.started(e.a)) gone = true;
          }
          if (!gone && hooks.prefill) {
            last_write = std::chrono::steady_clock::now();
            if (!hooks.prefill(e.a, e.b)) gone = true;
          }
          break;
        case JobEvent::Kind::Token:
          if (out.ttft_s < 0)
            out.ttft_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (!gone && !hidden(e.a) && !stopper.hit()) {
            const std::string text = dec.push((int32_t)e.a);
            if (!emit(raw ? raw_delta(text) : parser.push(text))) gone = true;
          }
          break;
        case JobEvent::Kind::Done: {
          out.result = std::move(e.result);
          if (!gone && !stopper.hit()) {
            const std::string tail = dec.finish();
            gone = raw ? !emit(raw_delta(tail)) : (!emit(parser.push(tail)) || !emit(parser.finish()));
            // Text held back as a possible stop-string start goes out now.
            if (!gone && !stopper.hit() && hooks.delta) {
              const text::OutputParser::Delta rest = raw_delta(stopper.finish());
              if (!rest.empty()) gone = !hooks.delta(rest);
            }
          }
          if (!gone && stopper.hit()) {
            out.ok = true;
            out.result.finish = Finish::Stop;
            out.stop_string = stopper.matched();
            return out;
          }
          if (!gone && out.result.finish == Finish::Cancelled && job.cancel_reason == CancelCause::Shutdown) {
            // Shutdown, not the client: the handler ends the stream with an error event.
            out.status = 503;
            out.error = "the server is shutting down";
            return out;
          }
          if (out.result.finish == Finish::Cancelled || gone) {
            out.client_gone = true;
            return out;
          }
          out.ok = true;
          return out;
        }
        case JobEvent::Kind::Failed:
          out.status = e.status;
          out.error = e.error;
          return out;
      }
    }
    if (!gone && conn.peer_gone()) gone = true;
    if (!gone && hooks.keepalive && std::chrono::steady_clock::now() - last_write >= ping) {
      last_write = std::chrono::steady_clock::now();
      if (!hooks.keepalive()) gone = true;
    }
  }
  job.cancel(CancelCause::ClientGone);
  out.client_gone = true;
  return out;
}

// One line per request, for operators and for the agent tests (tests/agents) that read it.
void log_request(const Job& job, const DriveHooks& hooks, const DriveOutcome& o) {
  const RequestInfo& in = hooks.info;
  const GenerateResult& r = o.result;
  std::string max = std::to_string(in.max_tokens.effective);
  if (in.max_tokens.capped_by)
    max += " (asked " + std::to_string(*in.max_tokens.requested) + ", capped by " + in.max_tokens.capped_by + ")";
  std::string finish = o.ok ? (o.stop_string.empty() ? finish_name(r.finish) : "stop_string") : o.client_gone ? "client_gone" : "error " + std::to_string(o.status);
  char ttft[32] = "-";
  if (o.ttft_s >= 0) std::snprintf(ttft, sizeof ttft, "%.3fs", o.ttft_s);
  std::fprintf(stderr,
               "sluice serve: request %s body=%zuB tools=%zu prompt=%u cached=%u max_tokens=%s ttft=%s generated=%zu "
               "finish=%s\n",
               in.endpoint.c_str(), in.body_bytes, in.tools, (unsigned)job.request.prompt.size(), r.reused_tokens, max.c_str(), ttft,
               r.tokens.size(), finish.c_str());
}

}  // namespace

DriveOutcome drive(ServerContext& ctx, Job& job, Connection& conn, TextMode mode, const DriveHooks& hooks) {
  DriveOutcome o = drive_job(ctx, job, conn, mode, hooks);
  log_request(job, hooks, o);
  return o;
}

std::string finish_reason(const DriveOutcome& o) {
  switch (o.result.finish) {
    case Finish::Context:
    case Finish::Length: return "length";
    case Finish::Cancelled: return "cancelled";
    case Finish::None:
    case Finish::Stop: return "stop";
  }
  return "stop";
}

std::string new_id(ServerContext& ctx, const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%llx%08llx", prefix, (unsigned long long)ctx.next_id.fetch_add(1),
                (unsigned long long)(rng() & 0xffffffffu));
  return buf;
}

}  // namespace sluice::server

namespace sluice::server {

std::vector<uint32_t> to_ids(const std::vector<int32_t>& v) { return std::vector<uint32_t>(v.begin(), v.end()); }

std::vector<uint32_t> encode_chat(const Session& s, const std::vector<text::ChatMessage>& messages,
                                  const text::ChatOptions& options, std::string* text_out) {
  std::string prompt;
  try {
    prompt = s.architecture().render_chat(messages, options);
  } catch (const Error& e) {
    throw bad_request(e.what());
  }
  // The BOS is part of the rendered text. The session reuses the model's own tokens for a
  // conversation that extends the previous request (tokenize_prompt), so it keeps its state.
  std::vector<uint32_t> ids = s.tokenize_prompt(prompt, /*add_bos=*/false);
  if (text_out) *text_out = std::move(prompt);
  return ids;
}

std::vector<uint32_t> chat_stop_tokens(const text::Tokenizer& tok) {
  std::vector<uint32_t> stops;
  if (auto id = tok.find("<｜User｜>")) stops.push_back((uint32_t)*id);
  return stops;
}

}  // namespace sluice::server
