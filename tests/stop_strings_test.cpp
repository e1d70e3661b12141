// Stop strings in the server's text stream (src/server/stop_strings.*): nothing from a stop
// string on is ever sent, whatever the chunking, and a possible start is held back, not lost.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/stop_strings.h"

namespace sluice::server {
namespace {

// Feeds `text` in pieces of `step` bytes; returns what was sent and whether a stop matched.
std::pair<std::string, bool> feed(const std::vector<std::string>& stops, const std::string& text, size_t step) {
  StopMatcher m(stops);
  std::string sent;
  for (size_t i = 0; i < text.size() && !m.hit(); i += step) sent += m.push(text.substr(i, step));
  if (!m.hit()) sent += m.finish();
  return {sent, m.hit()};
}

TEST(StopStrings, CutBeforeTheFirstMatchForEveryChunking) {
  const std::string text = "alpha beta <END> gamma <STOP> delta";
  for (size_t step = 1; step <= text.size(); ++step) {
    SCOPED_TRACE(step);
    EXPECT_EQ(feed({"<STOP>", "<END>"}, text, step), std::make_pair(std::string("alpha beta "), true));
    EXPECT_EQ(feed({"<STOP>"}, text, step), std::make_pair(std::string("alpha beta <END> gamma "), true));
    EXPECT_EQ(feed({"<NONE>"}, text, step), std::make_pair(text, false));
    EXPECT_EQ(feed({"a"}, text, step), std::make_pair(std::string(""), true));
  }
}

TEST(StopStrings, HoldsBackOnlyAPossibleStart) {
  StopMatcher m({"<STOP>"});
  EXPECT_EQ(m.push("abc<ST"), "abc");   // "<ST" might become "<STOP>"
  EXPECT_EQ(m.push("x"), "<STx");       // it did not
  EXPECT_EQ(m.push("<"), "");
  EXPECT_EQ(m.finish(), "<");           // the end: the held text goes out
  EXPECT_FALSE(m.hit());
  StopMatcher two({"aab"});
  EXPECT_EQ(two.push("aa"), "");
  EXPECT_EQ(two.push("a"), "a");        // "aaa": only "aa" can still start "aab"
  EXPECT_EQ(two.push("b"), "");
  EXPECT_TRUE(two.hit());
  EXPECT_EQ(two.matched(), "aab");
  EXPECT_EQ(two.push("more"), "");      // nothing after a match
}

TEST(StopStrings, RequestFields) {
  using nlohmann::json;
  EXPECT_TRUE(parse_stop_strings(json::object(), "stop").empty());
  EXPECT_TRUE(parse_stop_strings(json{{"stop", nullptr}}, "stop").empty());
  EXPECT_EQ(parse_stop_strings(json{{"stop", "x"}}, "stop"), std::vector<std::string>{"x"});
  EXPECT_EQ(parse_stop_strings(json{{"stop", {"x", "yz"}}}, "stop"), (std::vector<std::string>{"x", "yz"}));
  EXPECT_THROW(parse_stop_strings(json{{"stop", ""}}, "stop"), ApiError);
  EXPECT_THROW(parse_stop_strings(json{{"stop", 3}}, "stop"), ApiError);
  EXPECT_THROW(parse_stop_strings(json{{"stop", {"x", 1}}}, "stop"), ApiError);
  EXPECT_THROW(parse_stop_strings(json{{"stop", std::string(kMaxStopBytes + 1, 'a')}}, "stop"), ApiError);
  EXPECT_THROW(parse_stop_strings(json{{"stop", std::vector<std::string>(kMaxStopStrings + 1, "a")}}, "stop"), ApiError);
}

}  // namespace
}  // namespace sluice::server
