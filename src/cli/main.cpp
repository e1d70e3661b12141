// The sluice command line: subcommand dispatch and the error/exit-code contract
// (0 success, 1 error with one `sluice: error: ...` line on stderr, 2 usage error with a hint).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/cmd_bench.h"
#include "cli/cmd_chat.h"
#include "cli/cmd_perplexity.h"
#include "cli/cmd_devices.h"
#include "cli/cmd_plan.h"
#include "cli/cmd_run.h"
#include "cli/cmd_serve.h"
#include "cli/cmd_tokenize.h"
#include "cli/cmd_watchdog.h"
#include "util/error.h"
#include "util/file_size_limit.h"
#include "cli/commands.h"
#include "runtime/watchdog.h"

namespace {

using sluice::cli::UsageError;

// Messages go out as exactly one line.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1] ? 1u : 0u)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The closest known name to `word`, or "" when nothing is close enough to be a typo.
std::string nearest(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& n : names) {
    const size_t d = edit_distance(word, n);
    if (d < best_d) best_d = d, best = n;
  }
  return best;
}

// A negative number is a value ("-c -1"), never a misspelt flag: no "did you mean -h?" for it.
bool is_number(const std::string& a) {
  size_t i = a[0] == '-' || a[0] == '+' ? 1 : 0;
  if (i == a.size()) return false;
  bool digit = false;
  for (; i < a.size(); ++i) {
    if (std::isdigit((unsigned char)a[i])) digit = true;
    else if (a[i] != '.' && a[i] != 'e' && a[i] != 'E' && a[i] != '-' && a[i] != '+') return false;
  }
  return digit;
}

// What was wrong on the command line and where to look: the subcommand named in argv, the
// first word that is neither one of its flags nor a number (argv after "--" is a command for
// `sluice watchdog`, not ours), and the closest known name to it.
struct Usage {
  CLI::App* sub = nullptr;
  std::string unknown;     // e.g. "--tempp" or, with no subcommand, "inspekt"
  std::string suggestion;  // e.g. "--temp"; "" when nothing is close
  std::string hint() const {
    std::string h = suggestion.empty() ? "" : "did you mean " + suggestion + "? ";
    h += sub ? "run 'sluice " + sub->get_name() + " --help' for its options"
             : "run 'sluice --help' for the list of commands";
    return h;
  }
};

Usage find_usage(CLI::App& app, int argc, char** argv) {
  Usage u;
  std::vector<std::string> sub_names;
  for (CLI::App* s : app.get_subcommands([](CLI::App*) { return true; })) sub_names.push_back(s->get_name());
  int end = argc;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--") { end = i; break; }
  for (int i = 1; i < end; ++i) {
    const std::string a = argv[i];
    if (std::find(sub_names.begin(), sub_names.end(), a) != sub_names.end()) {
      u.sub = app.get_subcommand(a);
      break;
    }
  }
  CLI::App& scope = u.sub ? *u.sub : app;
  std::vector<std::string> flags;
  for (const CLI::Option* opt : scope.get_options()) {
    for (const auto& l : opt->get_lnames()) flags.push_back("--" + l);
    for (const auto& s : opt->get_snames()) flags.push_back("-" + s);
  }
  for (int i = 1; i < end && u.unknown.empty(); ++i) {
    std::string a = argv[i];
    if (a.size() > 1 && a[0] == '-' && !is_number(a)) {
      a = a.substr(0, a.find('='));
      if (std::find(flags.begin(), flags.end(), a) == flags.end()) u.unknown = a, u.suggestion = nearest(a, flags);
    } else if (!u.sub && i == 1) {
      u.unknown = a, u.suggestion = nearest(a, sub_names);
    }
  }
  return u;
}

// Standard output that could not be written (a full disk, the file size limit) is an error: what
// the command printed is incomplete. Returns the exit status to use.
int checked_stdout(int rc) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && !std::ferror(stdout)) return rc;
  const std::string why = err ? std::string(": ").append(sluice::write_error_text(err)) : std::string();
  std::fprintf(stderr, "sluice: error: cannot write standard output%s\n", why.c_str());
  return rc == 0 ? 1 : rc;
}

// CLI11's own text for a parse error, except where it garbles: "The following arguments were
// not expected: 1 --tempp" lists the unknown flag after its value, in reverse order.
std::string parse_error_text(const CLI::ParseError& e, const Usage& u) {
  if (!u.sub && !u.unknown.empty() && u.unknown[0] != '-') return "unknown command " + u.unknown;
  if (dynamic_cast<const CLI::ExtrasError*>(&e) && !u.unknown.empty()) return "unknown option " + u.unknown;
  return one_line(e.what());
}

}  // namespace

int main(int argc, char** argv) {
  // Past the file size limit (ulimit -f) a write fails with EFBIG, which each writer reports, removing
  // its temporary file; SIGXFSZ's default action would kill the process first (util/file_size_limit.h).
  sluice::ignore_file_size_signal();
  CLI::App app{"sluice: DeepSeek-V4.1-Flash GGUF tools", "sluice"};
  app.set_version_flag("--version", std::string("sluice ") + SLUICE_VERSION);
  app.require_subcommand(1);
  app.footer("Exit status: 0 on success, 1 on an error (one 'sluice: error: ...' line on stderr),\n"
             "2 on a usage error. Run 'sluice COMMAND --help' for a command's options.");

  sluice::cli::MakeModelOptions make_model;
  sluice::cli::InspectOptions inspect;
  sluice::cli::DumpTensorOptions dump_tensor;
  CLI::App* make_model_cmd = sluice::cli::setup_make_model(app, make_model);
  CLI::App* inspect_cmd = sluice::cli::setup_inspect(app, inspect);
  CLI::App* dump_tensor_cmd = sluice::cli::setup_dump_tensor(app, dump_tensor);
  sluice::cli::RunOptions run;
  CLI::App* run_cmd = sluice::cli::setup_run(app, run);
  sluice::cli::ServeOptions serve;
  CLI::App* serve_cmd = sluice::cli::setup_serve(app, serve);
  sluice::cli::ChatCommandOptions chat;
  CLI::App* chat_cmd = sluice::cli::setup_chat(app, chat);
  sluice::cli::PerplexityOptions perplexity;
  CLI::App* perplexity_cmd = sluice::cli::setup_perplexity(app, perplexity);
  sluice::cli::TokenizeOptions tokenize;
  CLI::App* tokenize_cmd = sluice::cli::setup_tokenize(app, tokenize);
  sluice::cli::PlanCommandOptions plan;
  CLI::App* plan_cmd = sluice::cli::setup_plan(app, plan);
  sluice::cli::BenchOptions bench;
  CLI::App* bench_cmd = sluice::cli::setup_bench(app, bench);
  sluice::cli::DevicesOptions devices;
  CLI::App* devices_cmd = sluice::cli::setup_devices(app, devices);
  sluice::cli::WatchdogCommandOptions watchdog;
  CLI::App* watchdog_cmd = sluice::cli::setup_watchdog(app, watchdog);

  // llama.cpp's -np for --parallel (CLI11 takes one-letter short names only). Not after "--",
  // which starts the command `sluice watchdog` runs.
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i)
    if (args[i] == "-np") args[i] = "--parallel";
    else if (args[i].rfind("-np=", 0) == 0) args[i] = "--parallel=" + args[i].substr(4);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  arg_ptrs.push_back(nullptr);
  argv = arg_ptrs.data();

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const Usage u = find_usage(app, argc, argv);
    std::fprintf(stderr, "sluice: error: %s (%s)\n", parse_error_text(e, u).c_str(), u.hint().c_str());
    return 2;
  }

  try {
    // --watchdog SOFT:HARD: this same command line again, minus the flag, under `sluice watchdog`.
    const std::string* watchdog_spec = run_cmd->parsed()          ? &run.engine.watchdog
                                       : chat_cmd->parsed()       ? &chat.engine.watchdog
                                       : serve_cmd->parsed()      ? &serve.engine.watchdog
                                       : perplexity_cmd->parsed() ? &perplexity.engine.watchdog
                                                                  : nullptr;
    if (watchdog_spec && !watchdog_spec->empty() && !sluice::under_watchdog()) {
      std::pair<uint64_t, uint64_t> limits;
      try {
        limits = sluice::parse_watchdog_spec(*watchdog_spec);
      } catch (const sluice::Error& e) {
        throw UsageError(e.what());  // a bad flag value, like every other one: exit 2
      }
      const auto [soft, hard] = limits;
      return sluice::run_under_watchdog(std::vector<std::string>(argv, argv + argc), soft, hard);
    }
    const auto dispatch = [&]() -> int {
      if (make_model_cmd->parsed()) return sluice::cli::run_make_model(make_model);
      if (inspect_cmd->parsed()) return sluice::cli::run_inspect(inspect);
      if (dump_tensor_cmd->parsed()) return sluice::cli::run_dump_tensor(dump_tensor);
      if (run_cmd->parsed()) return sluice::cli::run_run(run);
      if (serve_cmd->parsed()) return sluice::cli::run_serve(serve);
      if (chat_cmd->parsed()) return sluice::cli::run_chat(chat);
      if (perplexity_cmd->parsed()) return sluice::cli::run_perplexity(perplexity);
      if (tokenize_cmd->parsed()) return sluice::cli::run_tokenize(tokenize);
      if (plan_cmd->parsed()) return sluice::cli::run_plan(plan);
      if (bench_cmd->parsed()) return sluice::cli::run_bench(bench);
      if (watchdog_cmd->parsed()) return sluice::cli::run_watchdog(watchdog);
      if (devices_cmd->parsed()) return sluice::cli::run_devices(devices);
      std::fprintf(stderr, "sluice: error: no command given (run 'sluice --help')\n");
      return 2;
    };
    return checked_stdout(dispatch());
  } catch (const UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "sluice: error: %s (%s)\n", one_line(e.what()).c_str(),
                 find_usage(app, argc, argv).hint().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "sluice: error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
