// tandem.Tokenizer: the C++ tokenizers (data/tokenizer.h) for Python, for tests and users' scripts.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/data/tokenizer_files.h"

namespace py = pybind11;

namespace tandem {

namespace {

// A tokenizer with the folder settings it was opened with (the chat template).
struct PyTokenizer {
  std::shared_ptr<const Tokenizer> tokenizer;
  TokenizerSource source;
};

PyTokenizer open_for_python(const std::string& path, const std::optional<std::string>& eos) {
  PyTokenizer t;
  t.source = find_tokenizer(path);
  SpecialTokenNames overrides;
  overrides.eos = eos;
  t.tokenizer = open_tokenizer(t.source, overrides);
  return t;
}

std::vector<TokenId> encode(const PyTokenizer& t, const std::string& text, bool add_special_tokens) {
  py::gil_scoped_release release;
  return t.tokenizer->encode(text, add_special_tokens ? SpecialTokens::kInclude : SpecialTokens::kOmit);
}

std::string decode(const PyTokenizer& t, const std::vector<TokenId>& ids, bool skip_special_tokens) {
  py::gil_scoped_release release;
  return t.tokenizer->decode(ids, skip_special_tokens ? SpecialTokens::kOmit : SpecialTokens::kInclude);
}

py::bytes token_bytes(const PyTokenizer& t, TokenId id, bool first) {
  return py::bytes(t.tokenizer->token_bytes(id, first ? TokenPlace::kFirst : TokenPlace::kFollowing));
}

std::vector<std::pair<TokenId, std::string>> special_tokens(const PyTokenizer& t) {
  std::vector<std::pair<TokenId, std::string>> out;
  for (const auto& s : t.tokenizer->special_tokens()) out.emplace_back(s.id, s.text);
  return out;
}

constexpr const char* kOpenDoc =
    "Opens a tokenizer: a tokenizer.json (byte-level or SentencePiece-style BPE), a tokenizer.model "
    "(SentencePiece), a model folder or checkpoint holding one (its tokenizer_config.json names BOS, EOS and the "
    "chat template), or 'byte'. "
    "`eos` names the end-of-text token instead. ValueError names the path and the fix.";

}  // namespace

void bind_tokenizer(py::module_& m) {
  py::class_<PyTokenizer>(m, "Tokenizer",
                          "tandem's C++ tokenizer (the one `tandem tokenize` uses): "
                          "tandem.Tokenizer.open(path).encode(text) -> ids")
      .def_static("open", &open_for_python, py::arg("path"), py::arg("eos") = std::nullopt, kOpenDoc)
      .def_static("from_file", &open_for_python, py::arg("path"), py::arg("eos") = std::nullopt, kOpenDoc)
      .def("encode", &encode, py::arg("text"), py::arg("add_special_tokens") = false,
           "The ids of `text`; special tokens written in it become their ids. add_special_tokens adds what the "
           "tokenizer's template puts around a text (BOS).")
      .def("decode", &decode, py::arg("ids"), py::arg("skip_special_tokens") = false,
           "The text of `ids` (malformed UTF-8 becomes U+FFFD); special tokens kept unless skip_special_tokens.")
      .def("token_bytes", &token_bytes, py::arg("id"), py::arg("first") = false,
           "The bytes token `id` adds to decoded text, for streaming (first: as the first token that is not a "
           "special token, whose leading space SentencePiece drops).")
      .def(
          "token_to_id", [](const PyTokenizer& t, const std::string& s) { return t.tokenizer->token_to_id(s); },
          py::arg("token"), "The id of a vocabulary entry as stored ('Ġthe', '▁the', '<s>'), or None.")
      .def(
          "id_to_token", [](const PyTokenizer& t, TokenId id) { return t.tokenizer->id_to_token(id); }, py::arg("id"),
          "The stored form of `id` ('' outside the vocabulary).")
      .def_property_readonly(
          "vocab_size", [](const PyTokenizer& t) { return t.tokenizer->vocab_size(); }, "One more than the largest id.")
      .def_property_readonly(
          "eos_id", [](const PyTokenizer& t) { return t.tokenizer->eos_id(); }, "The end-of-text id, or None.")
      .def_property_readonly(
          "bos_id", [](const PyTokenizer& t) { return t.tokenizer->bos_id(); }, "The beginning-of-text id, or None.")
      .def_property_readonly("special_tokens", &special_tokens, "[(id, text)] of the special (control) tokens.")
      .def_property_readonly(
          "kind", [](const PyTokenizer& t) { return tokenizer_kind_name(t.tokenizer->kind()); },
          "'byte-level BPE', 'SentencePiece-style BPE', 'SentencePiece' or 'byte'.")
      .def_property_readonly(
          "file", [](const PyTokenizer& t) { return t.source.file; }, "The file read ('' for the byte tokenizer).")
      .def_property_readonly(
          "chat_template", [](const PyTokenizer& t) { return t.source.config.chat_template; },
          "The folder's chat template (Jinja text), '' when none.")
      .def("__repr__", [](const PyTokenizer& t) { return "tandem.Tokenizer(" + t.tokenizer->description() + ")"; });
}

}  // namespace tandem
