// `sluice serve -m FILE [--host 127.0.0.1] [--port 8080] ...`
#include "cli/cmd_serve.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/context_option.h"
#include "cli/open_browser.h"
#include "runtime/admission.h"
#include "runtime/meminfo.h"
#include "runtime/session.h"
#include "server/auth.h"
#include "server/server.h"
#include "util/error.h"

namespace sluice::cli {

CLI::App* setup_serve(CLI::App& app, ServeOptions& o) {
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI- and Anthropic-compatible HTTP server");
  cmd->add_option("-m,--model", o.model, "GGUF model file")->required();
  add_ctx_option(cmd, o.ctx, "min(model maximum, 4096)");
  cmd->add_option("--host", o.host, "address to bind (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", o.port, "port to listen on (0: any free port; the bound port is printed)");
  cmd->add_option("--queue", o.queue, "requests that may wait behind the running ones; more get 503 + Retry-After")
      ->check(CLI::Range(size_t{0}, size_t{1024}));
  cmd->add_option("--parallel", o.parallel,
                  "requests run at once (also -np): their decode steps are batched, each layer's experts read once "
                  "for all; the plan holds one sequence state per request (default 1)")
      ->check(CLI::Range(1u, 256u));
  cmd->add_option("--prefill-step", o.prefill_step,
                  "prompt tokens one step evaluates while other requests decode: bounds the stall a new prompt "
                  "causes the streams (0: the chunk; default 64)")
      ->check(CLI::Range(0u, 1u << 20));
  cmd->add_option("--cache-ram", o.cache_ram,
                  "memory for the prefix cache all requests share: whole states at prompt ends and user turns, "
                  "found by the longest matching token prefix (e.g. 512MiB; default 0: none)");
  auto* disk_dir = cmd->add_option("--kv-disk-dir", o.kv_disk_dir,
                                   "directory for states on disk (created if absent, not its parents): prompt-end and "
                                   "user-turn states written in the background, found again after a restart");
  auto* disk_budget = cmd->add_option("--kv-disk-budget", o.kv_disk_budget,
                                      "disk space the state files may take (e.g. 20GiB; least recently used go first)");
  disk_dir->needs(disk_budget);
  disk_budget->needs(disk_dir);
  cmd->add_option("--max-body", o.max_body, "largest request body (e.g. 8MiB); larger get 413");
  cmd->add_option("--request-memory", o.request_memory,
                  "memory for the requests in flight, planned with the model: bodies, their parsed JSON, tokenization "
                  "(default 256MiB); a request that does not fit now gets 503, one larger than it 413");
  cmd->add_option("--max-tokens-limit", o.max_tokens_limit, "largest max_tokens a request may ask for (also the default)")
      ->check(CLI::Range(1u, 1u << 24));
  auto* key = cmd->add_option("--api-key", o.api_key,
                               "require this key (Authorization: Bearer KEY or x-api-key: KEY); visible in ps, "
                               "prefer --api-key-file or SLUICE_API_KEY");
  key->each([&o](const std::string&) { o.api_key_given = true; });
  cmd->add_option("--api-key-file", o.api_key_file,
                  "require one of the keys in this file, one per line ('#' lines skipped); with several, each key's "
                  "prefix caches and state files serve no other key, and /metrics and /slots answer only the first")
      ->excludes(key);
  cmd->add_option("--cached-tokens-granularity", o.cached_tokens_granularity,
                  "report cached_tokens rounded down to a multiple of this (default 16), so a count does not tell "
                  "single tokens of a prompt sharing the cache; 1: exact")
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_option("--max-connections", o.max_connections, "open connections at once (slow senders are dropped first)")
      ->check(CLI::Range(size_t{4}, size_t{4096}));
  cmd->add_option("--request-timeout", o.request_timeout_s, "seconds a request's headers and body may take to arrive (408)")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--header-timeout", o.header_timeout_s,
                  "seconds a request's headers may take to arrive (408); slow senders are also dropped first when full")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--idle-timeout", o.idle_timeout_s, "seconds a keep-alive connection waits for its next request")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("-a,--alias", o.alias, "model id reported by the API (default: the file name without .gguf)");
  cmd->add_option("--sse-ping-interval", o.ping_interval_s, "seconds between SSE keep-alives while waiting or prefilling")
      ->check(CLI::Range(0.05, 3600.0));
  cmd->add_option("--temp", o.temp, "temperature for requests that do not set one");
  cmd->add_option("--top-p", o.top_p, "top_p for requests that do not set one");
  add_topk_minp_options(cmd, o.top_k, o.min_p);
  cmd->add_option("--max-json-depth", o.max_json_depth,
                  "deepest JSON nesting a request may carry (also inside tool-call argument strings); deeper get 400")
      ->check(CLI::Range(size_t{2}, size_t{1000}));
  cmd->add_option("--stop", o.stops, "a stop string added to every request's own (repeatable; matched in the content)")
      ->check([](const std::string& v) { return v.empty() ? std::string("a stop string cannot be empty") : std::string(); });
  cmd->add_option("--thinking", o.thinking, "request: think when the request asks (per API, see docs/server.md); off: never")
      ->check(CLI::IsMember({"request", "off"}));
  cmd->add_flag("--special-in-content", o.special_in_content,
                "UNSAFE with untrusted text: control-token spellings in request content (messages, tool results, "
                "completion prompts) become control tokens; by default they are text and only the chat template "
                "makes control tokens");
  cmd->add_flag("--no-webui", o.no_webui,
                "do not serve the chat page: / answers browsers with the JSON list of endpoints too");
  cmd->add_flag("--open", o.open_browser, "open the chat page in this desktop's browser (xdg-open) once listening");
  add_engine_options(cmd, o.engine);
  add_fabric_options(cmd, o.fabric);
  return cmd;
}

namespace {

// SIGINT/SIGTERM are blocked in every thread and taken by one waiting thread, which stops the
// server from ordinary code (stop() takes locks, so it cannot run in a signal handler). SIGHUP
// (the terminal went away) stops it the same way; SIGUSR1/SIGUSR2 mean nothing to it and are
// logged and ignored: by default each would kill the process mid-answer.
class SignalStopper {
 public:
  explicit SignalStopper(server::Server& s) : server_(s) {
    sigemptyset(&set_);
    for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&set_, sig);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
    thread_ = std::thread([this] {
      while (!done_) {
        const timespec ts{0, 200 * 1000 * 1000};
        const int sig = sigtimedwait(&set_, nullptr, &ts);
        if (sig == SIGUSR1 || sig == SIGUSR2) {
          std::fprintf(stderr, "sluice serve: %s ignored\n", sig == SIGUSR1 ? "SIGUSR1" : "SIGUSR2");
          continue;
        }
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
          std::fprintf(stderr, "sluice serve: %s, stopping\n",
                       sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP");
          server_.stop();
          return;
        }
      }
    });
  }
  ~SignalStopper() {
    done_ = true;
    thread_.join();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SignalStopper(const SignalStopper&) = delete;
  SignalStopper& operator=(const SignalStopper&) = delete;

 private:
  server::Server& server_;
  sigset_t set_{}, old_{};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// --api-key, else --api-key-file, else SLUICE_API_KEY (set but empty is refused: a key that
// was meant to be there must not silently turn authentication off). A key no request could
// carry (server::api_key_problem) is refused too: a bad --api-key value is a usage error.
// The file may hold several keys, one per line: each is then a scope of its own (its prefix
// caches and state files serve no other key).
std::vector<std::string> api_keys(const ServeOptions& o) {
  if (o.api_key_given) {
    if (const std::string why = server::api_key_problem(o.api_key); !why.empty()) throw UsageError("--api-key: the key " + why);
    return {o.api_key};
  }
  if (!o.api_key_file.empty()) return server::read_api_key_file(o.api_key_file);
  if (const char* env = std::getenv("SLUICE_API_KEY")) {
    std::string k = env;
    while (!k.empty() && std::isspace((unsigned char)k.back())) k.pop_back();
    while (!k.empty() && std::isspace((unsigned char)k.front())) k.erase(0, 1);
    if (k.empty()) throw Error("SLUICE_API_KEY is set but empty; unset it to serve without a key");
    if (const std::string why = server::api_key_problem(k); !why.empty()) throw Error("SLUICE_API_KEY: the key " + why);
    return {k};
  }
  return {};
}

}  // namespace

int run_serve(const ServeOptions& o) {
  // Request buffers (bodies up to --max-body, JSON, token lists) are large and short-lived. By
  // default glibc raises its mmap threshold to the largest block freed, after which such buffers
  // come from the heaps and their pages stay with the process: eight 1 MiB /tokenize requests
  // took the RSS from 47 to 134 MiB for good. A fixed threshold keeps them mmapped, so freeing
  // one returns it to the system.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  server::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.queue_depth = o.queue;
  so.prefill_step = o.prefill_step;
  try {
    so.max_body_bytes = parse_bytes(o.max_body, "--max-body");
    so.request_memory = parse_bytes(o.request_memory, "--request-memory");
  } catch (const Error& e) {
    throw UsageError(e.what());  // a bad flag value: exit 2
  }
  so.max_tokens_limit = o.max_tokens_limit;
  so.api_keys = api_keys(o);
  so.cached_tokens_granularity = o.cached_tokens_granularity;
  so.max_connections = o.max_connections;
  so.request_timeout_ms = (int)(o.request_timeout_s * 1000);
  so.header_timeout_ms = (int)(o.header_timeout_s * 1000);
  so.idle_timeout_ms = (int)(o.idle_timeout_s * 1000);
  so.alias = o.alias;
  so.ping_interval_ms = (int)(o.ping_interval_s * 1000);
  // The defaults pass the check every request's values pass (UsageError otherwise).
  const SamplerOptions defaults = sampler_options(o.temp, o.top_p, 0, o.top_k, o.min_p);
  so.temp = defaults.temp;
  so.top_p = defaults.top_p;
  so.top_k = defaults.top_k;
  so.min_p = defaults.min_p;
  so.max_json_depth = o.max_json_depth;
  so.stops = o.stops;
  so.thinking_off = o.thinking == "off";
  so.special_in_content = o.special_in_content;
  so.webui = !o.no_webui;

  SessionOptions sess = session_options(o.engine, o.model, o.ctx);
  sess.parallel = o.parallel;
  sess.plan_lines = server::plan_lines(so, o.parallel);
  if (!o.cache_ram.empty()) sess.cache_ram = parse_bytes(o.cache_ram, "--cache-ram");
  if (!o.kv_disk_dir.empty()) {
    sess.kv_disk_dir = o.kv_disk_dir;
    sess.kv_disk_budget = parse_bytes(o.kv_disk_budget, "--kv-disk-budget");
    if (sess.kv_disk_budget == 0) throw UsageError("--kv-disk-budget must be more than 0");
  }
  // The header's checks (architecture, -c against the model) before listening: the model
  // itself loads in the worker, after "listening" is printed.
  // Opened once here; the Session in the worker plans from the same header.
  auto header = std::make_shared<const ModelHeader>(open_model_header(o.model));
  if (const std::vector<std::string> problems = load_problems(header->file); !problems.empty())
    throw Error(with_path(o.model, problems.front()));
  check_ctx(o.ctx, header->config.max_position_embeddings);

  // --fabric: the other ranks compute experts; rank 0 serves. When the fabric breaks (a rank
  // missed its deadline), the step's requests get their error events, then the job ends.
  std::shared_ptr<FabricJob> job = FabricJob::open(o.fabric, *header);
  if (job && !job->coordinator()) return job->serve(sess, *header);
  if (job) {
    sess.remote = job->remote();
    so.on_step_error = [job](const std::string& error) {
      if (!job->broken()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the error events reach the clients
      job->fail(error);
    };
    so.extra_metrics = [job] { return fabric_metrics(job->traffic()); };
  }
  const std::string model_id = !o.alias.empty() ? o.alias : std::filesystem::path(o.model).stem().string();
  auto factory = [sess, header, job] {
    const auto t0 = std::chrono::steady_clock::now();
    auto s = std::make_unique<Session>(sess, *header);
    if (job) job->start(*s);
    std::fputs(format_plan(s->plan()).c_str(), stderr);  // the server log records what was admitted
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "sluice serve: model %s loaded in %.1f s, ctx %u, ready\n", s->model_id().c_str(), secs,
                 s->ctx());
    return s;
  };
  server::Server srv(so, factory, model_id);
  SignalStopper stopper(srv);
  const uint16_t port = srv.listen();
  const bool v6 = o.host.find(':') != std::string::npos;
  std::fprintf(stderr, "sluice serve: listening on http://%s%s%s:%u\n", v6 ? "[" : "", o.host.c_str(), v6 ? "]" : "",
               (unsigned)port);
  if (so.webui) {
    // A wildcard address is not one a browser can open: name this machine's loopback instead.
    const std::string h = o.host == "0.0.0.0" ? "127.0.0.1" : o.host == "::" ? "::1" : o.host;
    const bool h6 = h.find(':') != std::string::npos;
    const std::string page = "http://" + std::string(h6 ? "[" : "") + h + (h6 ? "]" : "") + ":" + std::to_string(port) + "/";
    std::fprintf(stderr, "sluice serve: chat page at %s (open it in a browser; --no-webui turns it off)\n", page.c_str());
    if (o.open_browser) {
      const std::string why = open_in_browser(page);
      std::fprintf(stderr, "sluice serve: %s\n", why.empty() ? ("opening " + page + " in the browser").c_str()
                                                            : ("--open: " + why + "; open " + page + " yourself").c_str());
    }
  } else if (o.open_browser) {
    std::fprintf(stderr, "sluice serve: --open: there is no chat page to open (--no-webui)\n");
  }
  std::fflush(stderr);
  try {
    srv.serve();
  } catch (const std::exception& e) {
    if (job) job->fail(e.what());  // the whole job ends with the error named once
    throw;
  }
  if (job) job->end();
  std::fprintf(stderr, "sluice serve: stopped\n");
  return 0;
}

}  // namespace sluice::cli
