// --mem-budget against this machine. A budget is a promise to stay below it, so a budget the
// machine cannot hold (1000 TiB on a 23 GiB host) promised nothing and used to pass silently
// whenever the plan was not printed. Now:
//   above MemAvailable            a warning on stderr, always (once per process)
//   above MemTotal + SwapTotal    refused (usage error, exit 2) unless --mem-budget-override
// plan only warns: it allocates nothing, and planning for a larger target machine is its use.
#pragma once
#include <string>

#include "runtime/admission.h"
#include "runtime/meminfo.h"

namespace sluice::cli {

inline constexpr const char* kBudgetOverrideFlag = "--mem-budget-override";

// Throws UsageError when refused (refuse_beyond_machine and no override); returns the warning
// text ("" when none) without printing it.
std::string budget_host_problem(const BudgetSpec& b, const MemInfo& mem, bool refuse_beyond_machine, bool override_flag);
// budget_host_problem on /proc/meminfo, printing the warning as "sluice: warning: ..." once.
void check_budget_on_host(const BudgetSpec& b, bool refuse_beyond_machine, bool override_flag);

}  // namespace sluice::cli
