// docs/storage.md quotes plan's figures for the published model; scripts/doc-figures prints them
// from `sluice plan` today. The doc must contain exactly what the script prints (the doc said
// 10.58 GiB / 11,367 experts while plan, with this machine's thread count, printed others).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "test_util.h"

namespace {

// Runs of whitespace (the doc wraps lines) as one space.
std::string squeeze(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const bool space = c == ' ' || c == '\n' || c == '\t';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : c;
  }
  return out;
}

}  // namespace

TEST(DocFigures, StorageMdQuotesWhatPlanPrints) {
#if defined(__SANITIZE_ADDRESS__)
  // The plan's runtime overhead is this process's measured resident set, which under
  // AddressSanitizer includes shadow memory; these figures are checked in the optimized build.
  GTEST_SKIP() << "the measured runtime overhead includes ASan shadow memory";
#endif
  const std::string root = std::string(SLUICE_TEST_DATA) + "/../..";
  const std::string cmd = sluice::test::q(root + "/scripts/doc-figures") + " " + sluice::test::q(SLUICE_BINARY);
  std::FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "scripts/doc-figures failed:\n" << out;
  const std::string doc = squeeze(sluice::test::slurp(root + "/docs/storage.md"));
  ASSERT_FALSE(doc.empty());
  std::istringstream lines(out);
  std::string line;
  int checked = 0;
  while (std::getline(lines, line)) {
    ++checked;
    EXPECT_NE(doc.find(squeeze(line)), std::string::npos) << "docs/storage.md lacks what plan prints today:\n" << line;
  }
  EXPECT_EQ(checked, 2) << out;
}
