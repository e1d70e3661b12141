#include "cli/budget_check.h"

#include <cstdio>

#include "cli/commands.h"

namespace sluice::cli {

std::string budget_host_problem(const BudgetSpec& b, const MemInfo& mem, bool refuse_beyond_machine, bool override_flag) {
  if (b.is_auto || mem.total == 0) return "";  // auto is derived from the host; no meminfo: nothing to compare
  const uint64_t machine = mem.total + mem.swap_total;
  const std::string budget = "--mem-budget " + format_bytes(b.bytes);
  if (b.bytes > machine) {
    const std::string what = budget + " is more than this machine has (MemTotal " + format_bytes(mem.total) +
                             " + SwapTotal " + format_bytes(mem.swap_total) + ")";
    if (refuse_beyond_machine && !override_flag)
      throw UsageError(what + "; lower it, use --mem-budget auto, or pass " + kBudgetOverrideFlag + " to use it anyway");
    return what + ": the budget does not bound anything the machine could hold";
  }
  if (b.bytes > mem.available)
    return budget + " is more than MemAvailable now (" + format_bytes(mem.available) +
           "): the process may be swapped or killed before it reaches the budget";
  return "";
}

void check_budget_on_host(const BudgetSpec& b, bool refuse_beyond_machine, bool override_flag) {
  MemInfo mem;
  try {
    mem = read_meminfo();
  } catch (const Error&) {
    return;  // no /proc/meminfo: admission reports what it can
  }
  const std::string warning = budget_host_problem(b, mem, refuse_beyond_machine, override_flag);
  // Once: run checks its options twice (before and after reading the model header).
  static bool warned = false;
  if (!warning.empty() && !warned) {
    warned = true;
    std::fprintf(stderr, "sluice: warning: %s\n", warning.c_str());
  }
}

}  // namespace sluice::cli
