#include "server/job_follow.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "server/stop_strings.h"
#include "text/token_text.h"

namespace sluice::server {

namespace {

DriveOutcome drive_job(ServerContext& ctx, Job& job, Connection& conn, TextMode mode, const DriveHooks& hooks) {
  const auto start = std::chrono::steady_clock::now();
  const Session& s = *ctx.worker.session();
  const text::Tokenizer& tok = s.tokenizer();
  const bool raw = mode == TextMode::Raw;
  // Eos, bos and the request's stop tokens end or frame the text; they never show in it.
  std::vector<TokenId> end_tokens = job.request.stop_tokens;
  if (tok.eos()) end_tokens.push_back(*tok.eos());
  if (tok.bos()) end_tokens.push_back(*tok.bos());
  text::OutputDecoder dec(tok, raw ? text::OutputMode::Plain : text::OutputMode::Chat, std::move(end_tokens));
  text::OutputParser parser(mode == TextMode::Thinking);
  DriveOutcome out;
  const auto ping = std::chrono::milliseconds(std::max(50, ctx.opts.ping_interval_ms));
  auto last_write = std::chrono::steady_clock::now();
  std::vector<JobEvent> events;

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
            if (hooks.started && !hooks.started(reported_cached(ctx, e.a))) gone = true;
          }
          if (!gone && hooks.prefill) {
            last_write = std::chrono::steady_clock::now();
            if (!hooks.prefill(e.a, e.b)) gone = true;
          }
          break;
        case JobEvent::Kind::Token:
          if (out.ttft_s < 0)
            out.ttft_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (!gone && dec.shows(e.a) && !stopper.hit()) {
            const std::string text = dec.push(e.a);
            if (!emit(raw ? raw_delta(text) : parser.push(text))) gone = true;
          }
          break;
        case JobEvent::Kind::Done: {
          out.result = std::move(e.result);
          out.result.reused_tokens = reported_cached(ctx, out.result.reused_tokens);
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
  if (o.ttft_s >= 0) ctx.counters.observe_ttft(o.ttft_s);
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

}  // namespace sluice::server
