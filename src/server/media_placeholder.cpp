#include "server/media_placeholder.h"

namespace sluice::server {

using nlohmann::json;

namespace {

constexpr const char* kTextOnly = "this model reads text only";
// A URL longer than this is not copied into the prompt (data: URLs are described instead).
constexpr size_t kMaxUrlInPrompt = 256;

std::string str(const json& j, const char* key) {
  const auto it = j.is_object() ? j.find(key) : j.end();
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// "image/png, 12345 bytes base64" / "a URL (https://...)" / "a file id (file_...)".
std::string describe_source(const json& src, const std::string& fallback_type) {
  const std::string kind = str(src, "type");
  std::string media = str(src, "media_type");
  if (media.empty()) media = fallback_type;
  if (kind == "base64") return media + ", " + std::to_string(str(src, "data").size()) + " bytes base64";
  if (kind == "url") {
    const std::string url = str(src, "url");
    return url.size() <= kMaxUrlInPrompt ? "URL " + url : "a URL of " + std::to_string(url.size()) + " bytes";
  }
  if (kind == "file") return "file id " + str(src, "file_id").substr(0, kMaxUrlInPrompt);
  return kind.empty() ? media : kind + " source";
}

std::string placeholder(const std::string& what, const std::string& desc, std::vector<std::string>& omitted) {
  std::string entry = what;
  entry.append(" (").append(desc).append(")");
  omitted.push_back(std::move(entry));
  std::string text = "[";
  text.append(what).append(" omitted: ").append(desc).append("; ").append(kTextOnly).append("]");
  return text;
}

// data:image/png;base64,AAAA -> "image/png, 4 bytes base64".
std::string describe_url(const std::string& url) {
  if (url.rfind("data:", 0) == 0) {
    const size_t comma = url.find(',');
    const std::string head = url.substr(5, comma == std::string::npos ? std::string::npos : comma - 5);
    const size_t semi = head.find(';');
    const std::string media = head.substr(0, semi);
    const size_t n = comma == std::string::npos ? 0 : url.size() - comma - 1;
    return (media.empty() ? std::string("data") : media) + ", " + std::to_string(n) + " bytes" +
           (head.find(";base64") != std::string::npos ? " base64" : "");
  }
  return url.size() <= kMaxUrlInPrompt ? "URL " + url : "a URL of " + std::to_string(url.size()) + " bytes";
}

// "\"name\"", at most kMaxUrlInPrompt bytes of it.
std::string quote_name(const std::string& s) {
  std::string q = "\"";
  q.append(s, 0, kMaxUrlInPrompt).push_back('"');
  return q;
}

}  // namespace

bool is_anthropic_media(const std::string& type) { return type == "image" || type == "document"; }

bool is_openai_media(const std::string& type) {
  return type == "image_url" || type == "input_audio" || type == "file" || type == "input_image" ||
         type == "input_file";
}

std::string anthropic_media_text(const json& block, std::vector<std::string>& omitted) {
  const std::string type = str(block, "type");
  const json src = block.value("source", json::object());
  if (type == "document") {
    // Plain-text documents are text: keep them (with their title, which the client chose to send).
    std::string text;
    if (str(src, "type") == "text") {
      text = str(src, "data");
    } else if (str(src, "type") == "content" && src.contains("content")) {
      const json& c = src["content"];
      if (c.is_string()) text = c.get<std::string>();
      if (c.is_array())
        for (const json& b : c)
          if (str(b, "type") == "text") {
            if (!text.empty()) text += "\n\n";
            text += str(b, "text");
          }
    }
    const std::string title = str(block, "title");
    if (!text.empty()) return title.empty() ? text : title + "\n\n" + text;
    std::string desc = describe_source(src, "document");
    if (!title.empty()) desc = quote_name(title) + ", " + desc;
    return placeholder("document", desc, omitted);
  }
  return placeholder("image", describe_source(src, "image"), omitted);
}

std::string openai_media_text(const json& part, std::vector<std::string>& omitted) {
  const std::string type = str(part, "type");
  if (type == "image_url" || type == "input_image") {
    const json& v = part.contains("image_url") ? part["image_url"] : json();
    const std::string url = v.is_string() ? v.get<std::string>() : str(v, "url");
    return placeholder("image", url.empty() ? "image" : describe_url(url), omitted);
  }
  if (type == "input_audio") {
    const json a = part.value("input_audio", json::object());
    std::string fmt = str(a, "format");
    return placeholder("audio", (fmt.empty() ? std::string("audio") : fmt) + ", " +
                                    std::to_string(str(a, "data").size()) + " bytes base64", omitted);
  }
  // file / input_file: {"file": {"filename", "file_data" | "file_id"}} (Responses: at the top level).
  const json f = part.contains("file") && part["file"].is_object() ? part["file"] : part;
  std::string desc = str(f, "filename").substr(0, kMaxUrlInPrompt);
  const std::string data = str(f, "file_data"), id = str(f, "file_id");
  const std::string where = !data.empty() ? (data.rfind("data:", 0) == 0 ? describe_url(data)
                                                                          : std::to_string(data.size()) + " bytes base64")
                           : !id.empty() ? "file id " + id.substr(0, kMaxUrlInPrompt) : "file";
  desc = desc.empty() ? where : quote_name(desc) + ", " + where;
  return placeholder("file", desc, omitted);
}

}  // namespace sluice::server
