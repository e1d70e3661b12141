// The sluice command line: subcommand dispatch and the error/exit-code contract
// (0 success, 1 error with one `sluice: error: ...` line on stderr, 2 usage error with a hint).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/cmd_chat.h"
#include "cli/cmd_plan.h"
#include "cli/cmd_run.h"
#include "cli/cmd_serve.h"
#include "cli/cmd_tokenize.h"
#include "cli/cmd_watchdog.h"
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

// "did you mean ...?" for the first unknown flag or subcommand in argv, plus where to look.
std::string usage_hint(CLI::App& app, int argc, char** argv) {
  CLI::App* sub = nullptr;
  std::vector<std::string> sub_names;
  for (CLI::App* s : app.get_subcommands([](CLI::App*) { return true; })) sub_names.push_back(s->get_name());
  int first_arg = 1;
  for (; first_arg < argc; ++first_arg) {
    const std::string a = argv[first_arg];
    if (std::find(sub_names.begin(), sub_names.end(), a) != sub_names.end()) {
      sub = app.get_subcommand(a);
      break;
    }
  }
  CLI::App& scope = sub ? *sub : app;
  std::vector<std::string> flags;
  for (const CLI::Option* opt : scope.get_options()) {
    for (const auto& l : opt->get_lnames()) flags.push_back("--" + l);
    for (const auto& s : opt->get_snames()) flags.push_back("-" + s);
  }
  std::string suggestion;
  for (int i = 1; i < argc && suggestion.empty(); ++i) {
    std::string a = argv[i];
    if (a.size() > 1 && a[0] == '-') {
      a = a.substr(0, a.find('='));
      if (std::find(flags.begin(), flags.end(), a) == flags.end()) suggestion = nearest(a, flags);
    } else if (!sub && i == 1) {
      suggestion = nearest(a, sub_names);
    }
  }
  std::string hint = suggestion.empty() ? "" : "did you mean " + suggestion + "? ";
  hint += sub ? "run 'sluice " + sub->get_name() + " --help' for its options"
              : "run 'sluice --help' for the list of commands";
  return hint;
}

}  // namespace

int main(int argc, char** argv) {
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
  sluice::cli::TokenizeOptions tokenize;
  CLI::App* tokenize_cmd = sluice::cli::setup_tokenize(app, tokenize);
  sluice::cli::PlanCommandOptions plan;
  CLI::App* plan_cmd = sluice::cli::setup_plan(app, plan);
  sluice::cli::WatchdogCommandOptions watchdog;
  CLI::App* watchdog_cmd = sluice::cli::setup_watchdog(app, watchdog);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "sluice: error: %s (%s)\n", one_line(e.what()).c_str(),
                 usage_hint(app, argc, argv).c_str());
    return 2;
  }

  try {
    // --watchdog SOFT:HARD: this same command line again, minus the flag, under `sluice watchdog`.
    const std::string* watchdog_spec = run_cmd->parsed()     ? &run.engine.watchdog
                                       : chat_cmd->parsed()  ? &chat.engine.watchdog
                                       : serve_cmd->parsed() ? &serve.engine.watchdog
                                                             : nullptr;
    if (watchdog_spec && !watchdog_spec->empty() && !sluice::under_watchdog()) {
      const auto [soft, hard] = sluice::parse_watchdog_spec(*watchdog_spec);
      return sluice::run_under_watchdog(std::vector<std::string>(argv, argv + argc), soft, hard);
    }
    if (make_model_cmd->parsed()) return sluice::cli::run_make_model(make_model);
    if (inspect_cmd->parsed()) return sluice::cli::run_inspect(inspect);
    if (dump_tensor_cmd->parsed()) return sluice::cli::run_dump_tensor(dump_tensor);
    if (run_cmd->parsed()) return sluice::cli::run_run(run);
    if (serve_cmd->parsed()) return sluice::cli::run_serve(serve);
    if (chat_cmd->parsed()) return sluice::cli::run_chat(chat);
    if (tokenize_cmd->parsed()) return sluice::cli::run_tokenize(tokenize);
    if (plan_cmd->parsed()) return sluice::cli::run_plan(plan);
    if (watchdog_cmd->parsed()) return sluice::cli::run_watchdog(watchdog);
    std::fprintf(stderr, "sluice: error: no command given (run 'sluice --help')\n");
    return 2;
  } catch (const UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "sluice: error: %s (%s)\n", one_line(e.what()).c_str(),
                 usage_hint(app, argc, argv).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "sluice: error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
