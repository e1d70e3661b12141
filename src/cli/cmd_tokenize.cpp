// `sluice tokenize -m FILE.gguf [--text "..." | stdin] [--ids] [--no-bos] [--no-special]`
#include "cli/cmd_tokenize.h"

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "model/architecture.h"
#include "text/tokenizer.h"
#include "util/read_file.h"

namespace sluice::cli {
namespace {

// Tokenizing costs about 14 bytes of memory per byte of text; 64 MiB (~1 GB of work memory) is
// far more than any model's context holds, and an endless stdin (/dev/zero) stops here.
constexpr uint64_t kMaxStdinBytes = 64ull << 20;

// A token's bytes as one printable, quoted field: control bytes and quotes escaped so a
// hostile vocabulary or input cannot garble the terminal; UTF-8 passes through.
std::string quoted(std::string_view s) {
  std::string out = "'";
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c == '\'' || c == '\\') out += std::string("\\") + (char)c;
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += (char)c;
    }
  }
  return out + "'";
}

}  // namespace

CLI::App* setup_tokenize(CLI::App& app, TokenizeOptions& o) {
  CLI::App* cmd = app.add_subcommand("tokenize", "Tokenize text with a GGUF file's tokenizer");
  cmd->add_option("-m,--model", o.model, "GGUF file holding tokenizer.ggml.* keys")->required();
  cmd->add_option("--text", o.text, "text to tokenize (default: read stdin)")
      ->each([&o](const std::string&) { o.text_given = true; });  // stdin: at most 64 MiB
  cmd->add_flag("--ids", o.ids_only, "print only the ids, space-separated, on one line");
  cmd->add_flag("--no-bos", o.no_bos, "do not prepend the BOS token");
  cmd->add_flag("--no-special", o.no_special, "treat control-token strings in the text as plain text");
  cmd->footer("Default output: one line per token, 'ID<TAB>PIECE' with the piece quoted and escaped.");
  return cmd;
}

int run_tokenize(const TokenizeOptions& o) {
  const gguf::File f = open_gguf(o.model);
  // A model file of another architecture is refused as such; a vocabulary-only file (no
  // tensors, like data/deepseek-v3-vocab.gguf) is read for its tokenizer whatever it names.
  if (!f.tensors().empty())
    if (auto problem = architecture_problem(f)) throw Error(with_path(o.model, *problem));
  const text::Tokenizer tok = text::Tokenizer::from_gguf(f);
  std::string input = o.text;
  if (!o.text_given) {
    input = read_fd_bounded(0, "standard input", kMaxStdinBytes,
                            "tokenize reads at most 64 MiB; split larger inputs");
  }
  const std::vector<TokenId> ids = tok.encode(input, !o.no_bos && tok.add_bos_default(), !o.no_special);
  std::string out;
  if (o.ids_only) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(ids[i]);
    }
    out += '\n';
  } else {
    for (TokenId id : ids) out += std::to_string(id) + "\t" + quoted(tok.token_to_piece(id)) + "\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace sluice::cli
