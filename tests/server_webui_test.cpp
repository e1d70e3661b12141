// The chat page at / (src/server/chat_page.html, server/webui.h): who gets it (a browser's
// Accept), who keeps the JSON (API clients, --no-webui), and the policy it runs under (a fresh
// nonce per response for its own script and style, no other host). The page itself is tested in
// a real browser by tests/webui/run.sh.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/webui.h"
#include "server_harness.h"

namespace {

using namespace sluice::test;
using sluice::server::accepts_html;
using sluice::server::chat_page;
using sluice::server::HttpRequest;
using sluice::server::page_with_nonce;

const char* const kBrowserAccept =
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8\r\n";

HttpRequest with_accept(const std::string& accept) {
  HttpRequest r;
  r.method = "GET";
  r.path = "/";
  if (!accept.empty()) r.headers.push_back({"accept", accept});
  return r;
}

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

TEST(WebUi, ABrowsersAcceptGetsThePageAndAnApiClientsDoesNot) {
  EXPECT_TRUE(accepts_html(with_accept("text/html,application/xhtml+xml,*/*;q=0.8")));
  EXPECT_TRUE(accepts_html(with_accept("TEXT/HTML")));
  EXPECT_TRUE(accepts_html(with_accept("application/json, text/html;q=0.5")));
  EXPECT_TRUE(accepts_html(with_accept("text/html;level=1;q=0.001")));
  EXPECT_FALSE(accepts_html(with_accept("")));
  EXPECT_FALSE(accepts_html(with_accept("*/*")));  // curl
  EXPECT_FALSE(accepts_html(with_accept("application/json")));
  EXPECT_FALSE(accepts_html(with_accept("text/html;q=0")));
  EXPECT_FALSE(accepts_html(with_accept("text/html; q=0.000, application/json")));
  EXPECT_FALSE(accepts_html(with_accept("text/htmlx")));
}

// The page talks to this server alone and builds its document from text: a guard against a
// change that would fetch from elsewhere or parse strings as markup.
TEST(WebUi, ThePageIsSelfContainedAndWritesNoMarkupFromStrings) {
  const std::string page(chat_page());
  ASSERT_GT(page.size(), 1000u);
  EXPECT_EQ(count(page, "<script"), 1u);
  EXPECT_EQ(count(page, "<style"), 1u);
  EXPECT_EQ(page.find("http://"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  EXPECT_EQ(page.find("//cdn"), std::string::npos);
  for (const char* sink : {"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                           "srcdoc", "javascript:"})
    EXPECT_EQ(page.find(sink), std::string::npos) << sink;
  // No inline event handler attributes (the policy would refuse them: the page would break).
  EXPECT_FALSE(std::regex_search(page, std::regex(R"(\son[a-z]+\s*=\s*["'])"))) << "an inline handler";
}

TEST(WebUi, EveryScriptAndStyleTagGetsTheNonce) {
  const std::string out = page_with_nonce("<style>a{}</style><p>x</p><script>1</script><script>2</script>", "N1");
  EXPECT_EQ(out, "<style nonce=\"N1\">a{}</style><p>x</p><script nonce=\"N1\">1</script><script nonce=\"N1\">2</script>");
  const std::string page = page_with_nonce(chat_page(), "abc");
  EXPECT_EQ(count(page, "<script nonce=\"abc\">"), 1u);
  EXPECT_EQ(count(page, "<style nonce=\"abc\">"), 1u);
}

std::string nonce_of(const Response& r) {
  const std::string csp = r.headers.count("content-security-policy") ? r.headers.at("content-security-policy") : "";
  std::smatch m;
  return std::regex_search(csp, m, std::regex("script-src 'nonce-([0-9a-f]+)'")) ? m[1].str() : "";
}

TEST(ServerWebUi, BrowsersGetThePageApiClientsTheJson) {
  Server s({});
  const Response page = s.roundtrip(request_text("GET", "/", "", kBrowserAccept));
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(page.headers.at("content-type"), "text/html; charset=utf-8");
  const std::string csp = page.headers.at("content-security-policy");
  EXPECT_NE(csp.find("default-src 'none'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("connect-src 'self'"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("unsafe-inline"), std::string::npos) << csp;
  const std::string nonce = nonce_of(page);
  ASSERT_EQ(nonce.size(), 32u) << csp;
  EXPECT_NE(page.body.find("<script nonce=\"" + nonce + "\">"), std::string::npos);
  EXPECT_NE(page.body.find("<style nonce=\"" + nonce + "\">"), std::string::npos);
  EXPECT_EQ(page.headers.at("cache-control"), "no-store");  // the nonce is the response's own
  EXPECT_NE(nonce_of(s.roundtrip(request_text("GET", "/", "", kBrowserAccept))), nonce);

  const Response head = s.roundtrip(request_text("HEAD", "/", "", kBrowserAccept));
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.headers.at("content-type"), "text/html; charset=utf-8");
  EXPECT_EQ(head.body, "");

  const Response api = s.roundtrip(request_text("GET", "/", "", "Accept: application/json\r\n"));
  ASSERT_EQ(api.status, 200);
  const json j = json::parse(api.body);
  EXPECT_EQ(j["name"], "sluice");
  EXPECT_EQ(j["chat_page"], true);
  EXPECT_EQ(j["api_key_required"], false);
  EXPECT_EQ(json::parse(s.get("/").body)["name"], "sluice");  // no Accept at all
  EXPECT_NE(s.log().find("chat page at http://127.0.0.1:"), std::string::npos) << s.log();
}

TEST(ServerWebUi, NoWebuiAnswersJsonToBrowsersToo) {
  Server s({"--no-webui"});
  const Response r = s.roundtrip(request_text("GET", "/", "", kBrowserAccept));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.at("content-type"), "application/json");
  EXPECT_EQ(json::parse(r.body)["chat_page"], false);
  EXPECT_EQ(s.log().find("chat page at"), std::string::npos) << s.log();
}

// The page holds no secret and needs no key; the API behind it does, and / says so.
TEST(ServerWebUi, WithAKeyThePageLoadsAndTheApiAsksForTheKey) {
  Server s({"--api-key", "webui-test-key"});
  EXPECT_EQ(s.roundtrip(request_text("GET", "/", "", kBrowserAccept)).status, 200);
  EXPECT_EQ(json::parse(s.get("/").body)["api_key_required"], true);
  EXPECT_EQ(s.get("/v1/models").status, 401);
}

// --open hands the page's address, as one argument, to the desktop's opener (xdg-open on PATH;
// here a stand-in that writes down what it was given).
TEST(ServerWebUi, OpenHandsThePagesAddressToTheDesktopsOpener) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("sluice_webui_open_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path opened = dir / "opened";
  {
    std::ofstream f(dir / "xdg-open");
    f << "#!/bin/sh\nprintf '%s|' \"$@\" > '" << opened.string() << ".tmp' && mv '" << opened.string() << ".tmp' '"
      << opened.string() << "'\n";
  }
  std::filesystem::permissions(dir / "xdg-open", std::filesystem::perms::owner_all);
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin";
  ::setenv("PATH", (dir.string() + ":" + path).c_str(), 1);
  Server s({"--open"});
  ::setenv("PATH", path.c_str(), 1);
  const std::string url = "http://127.0.0.1:" + std::to_string(s.port()) + "/";
  for (int i = 0; i < 500 && !std::filesystem::exists(opened); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::ifstream in(opened);
  const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, url + "|");
  EXPECT_NE(s.log().find("opening " + url + " in the browser"), std::string::npos) << s.log();
  std::filesystem::remove_all(dir);
}

}  // namespace
