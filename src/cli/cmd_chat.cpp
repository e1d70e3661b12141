#include "cli/cmd_chat.h"

#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <unistd.h>

#include "cli/commands.h"
#include "cli/context_option.h"
#include "cli/fabric_job.h"
#include "cli/stop_signals.h"
#include "model/architecture.h"
#include "runtime/session.h"
#include "text/deepseek41/chat.h"
#include "text/deepseek41/dsml.h"
#include "text/prompt_limit.h"
#include "text/token_text.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "util/error.h"
#include "util/read_file.h"

namespace sluice::cli {

CLI::App* setup_chat(CLI::App& app, ChatCommandOptions& o) {
  CLI::App* sub = app.add_subcommand("chat", "Chat with the model on the terminal");
  sub->footer(
      "Each line on stdin is one user message; the reply streams to stdout. Commands: /reset\n"
      "forgets the conversation, /exit (or end of input) quits. With --think on, the reasoning\n"
      "streams to stderr. A summary per reply goes to stderr.");
  sub->add_option("-m,--model", o.model, "deepseek41 GGUF file")->required();
  sub->add_option("--system", o.system, "system prompt");
  sub->add_option("--think", o.think, "thinking on or off (default off)")->check(CLI::IsMember({"on", "off"}));
  sub->add_option("-n,--n-predict", o.n_predict, "tokens per reply at most (default 1024)");
  sub->add_option("--temp", o.temp, "temperature; 0 = greedy (default 0)");
  sub->add_option("--top-p", o.top_p, "nucleus mass in [0, 1] (default 1.0)");
  add_topk_minp_options(sub, o.top_k, o.min_p);
  sub->add_option("--seed", o.seed, "sampler seed (default 0)");
  add_ctx_option(sub, o.ctx, "min(model maximum, 4096)");
  add_engine_options(sub, o.engine);
  add_fabric_options(sub, o.fabric);
  return sub;
}

int run_chat(const ChatCommandOptions& o) {
  const StopSignals stop_signals;  // SIGTERM/SIGINT: finish the current token, then exit 0
  if (o.n_predict < 1) throw UsageError("-n must be at least 1");
  const SamplerOptions so = sampler_options(o.temp, o.top_p, o.seed, o.top_k, o.min_p);
  SessionOptions sess = session_options(o.engine, o.model, o.ctx);
  const ModelHeader header = open_model_header(o.model);
  check_ctx(o.ctx, header.config.max_position_embeddings);
  // --fabric: the other ranks compute experts; rank 0 (which mpirun gives stdin) chats.
  const std::unique_ptr<FabricJob> job = FabricJob::open(o.fabric, header);
  if (job && !job->coordinator()) return job->serve(sess, header);
  if (job) sess.remote = job->remote();
  Session session(std::move(sess), header);
  if (job) job->start(session);
  maybe_print_plan(o.engine, session);
  const text::Tokenizer& tok = session.tokenizer();
  const ModelConfig& c = session.config();
  text::ChatOptions co;
  co.thinking = o.think == "on";
  co.reasoning_effort = co.thinking ? text::kEffortHigh : 0;
  co.own_assistant_turns = true;  // the history keeps the model's own replies, hidden tokens included

  std::vector<text::ChatMessage> history;
  if (!o.system.empty()) history.push_back({"system", o.system, "", {}, ""});
  {
    // The chat format around an empty message (BOS, system prompt, user and assistant markers)
    // plus one reply token must fit, or no message ever could: say so now, not at the first one.
    std::vector<text::ChatMessage> empty = history;
    empty.push_back({"user", "", "", {}, ""});
    const size_t frame = text::encode_chat_text(tok, session.architecture().render_chat(empty, co)).size() + 1;
    if (session.ctx() < frame)
      throw UsageError(std::string(kCtxFlag) + " " + std::to_string(session.ctx()) +
                       " is too small for chat: the chat format around an empty message and one reply token take " +
                       std::to_string(frame) + " positions");
  }
  // A line longer than any prompt the context can hold is skipped unread (text/prompt_limit.h).
  const uint64_t line_limit = text::prompt_byte_limit(tok, session.ctx());
  std::string line;
  while (true) {
    if (isatty(0)) std::fputs("> ", stdout), std::fflush(stdout);
    if (StopSignals::raised()) break;
    const LineRead got = read_line_bounded(std::cin, line, (size_t)line_limit);
    if (got == LineRead::End || line == "/exit") break;
    if (got == LineRead::TooLong) {
      std::fprintf(stderr, "sluice chat: a message of more than %llu bytes cannot fit the context of %u tokens; skipped\n",
                   (unsigned long long)line_limit, session.ctx());
      continue;
    }
    if (line == "/reset") {
      history.resize(o.system.empty() ? 0 : 1);
      session.reset();
      continue;
    }
    if (line.empty()) continue;
    history.push_back({"user", line, "", {}, ""});
    const text::PromptText rendered = session.architecture().render_chat(history, co);
    GenerateRequest req;
    // The session keeps the model's own tokens for the turns it generated (see tokenize_prompt).
    req.prompt = session.tokenize_prompt(rendered, /*add_bos=*/false);  // the rendering has BOS
    req.prompt_text = rendered.text;
    if (req.prompt.size() >= session.ctx()) {
      std::fprintf(stderr, "sluice chat: the conversation (%zu tokens) no longer fits the context %u; /reset\n",
                   req.prompt.size(), session.ctx());
      history.pop_back();
      continue;
    }
    req.max_tokens = (uint32_t)std::min<uint64_t>((uint64_t)o.n_predict, session.ctx() - req.prompt.size());
    req.sampling = so;
    text::OutputParser parser(co.thinking);
    text::OutputDecoder decoder(tok, text::OutputMode::Chat, {c.eos_token_id});  // the output rule of run and serve
    // A token can end inside a character, and a random or hostile model can emit any bytes:
    // what reaches the terminal is valid UTF-8, ill-formed parts shown as U+FFFD.
    text::Utf8Stream shown_reasoning, shown_content;
    auto put = [](std::FILE* f, const std::string& s) { std::fwrite(s.data(), 1, s.size(), f); };
    auto show = [&](const text::OutputParser::Delta& d) {
      put(stderr, shown_reasoning.push(d.reasoning));
      put(stdout, shown_content.push(d.content));
      for (const text::ToolCall& call : d.calls)
        put(stdout, shown_content.finish() + "\n[tool call " + text::utf8_sanitize(call.name) + " " +
                        text::utf8_sanitize(call.arguments) + "]\n");
      std::fflush(stdout);
    };
    const GenerateResult r = session.generate(req, {}, [&](TokenId id) {
      show(parser.push(decoder.push(id)));
      return StopSignals::raised() == 0;
    });
    show(parser.push(decoder.finish()));
    show(parser.finish());
    put(stderr, shown_reasoning.finish());
    put(stdout, shown_content.finish());
    std::printf("\n");
    std::fflush(stdout);
    // The history keeps what the model generated, hidden tokens included, so the next turn's
    // rendering extends the kept tokens exactly (tokenize_prompt reuses them).
    std::vector<TokenId> said;
    for (TokenId id : r.tokens)
      if (id != c.eos_token_id) said.push_back(id);
    const text::ParsedOutput turn = text::parse_output(tok.decode(said, /*render_special=*/true), co.thinking);
    history.push_back({"assistant", turn.content, turn.reasoning, {}, ""});
    std::fprintf(stderr, "[%u prompt tokens (%u reused) in %.2f s, %zu generated in %.2f s, stop: %s | %s]\n",
                 r.prompt_tokens, r.reused_tokens, r.prefill_s, r.tokens.size(), r.decode_s, finish_name(r.finish),
                 session_summary(session, r.prompt_tokens - r.reused_tokens + r.decode_steps).c_str());
    if (job) std::fprintf(stderr, "[%s]\n", job->summary().c_str());
  }
  if (job) job->end();
  return 0;
}

}  // namespace sluice::cli
