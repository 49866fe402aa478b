#pragma once
// The OpenAI HTTP API's request and response bodies, for `tandem serve`: requests of
// /v1/completions and /v1/chat/completions parsed and checked into one struct, and the JSON of
// responses, stream chunks (server-sent events) and errors. No HTTP here (serve/http_server.h).
//
// Note [OpenAI API subset]
// What a client of OpenAI's API sends works unchanged where tandem can honour it: model, prompt or
// messages, max_tokens (max_completion_tokens), temperature, top_p, n=1, stop, seed, stream,
// stream_options.include_usage, user, and penalties of 0. Two widely used extensions are taken as
// vLLM spells them: top_k and repetition_penalty. Anything else is refused with 400 and the name
// of the field, as OpenAI's server refuses unknown arguments: a silently ignored field is a wrong
// answer the client cannot see.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tandem/serve/chat_format.h"

namespace tandem {

/// The two generation endpoints.
enum class ApiEndpoint { kCompletions, kChatCompletions };

/// Why a choice ended, as the API names it.
enum class FinishReason { kStop, kLength };

/// "stop", "length".
const char* finish_reason_name(FinishReason reason);

/// A request refused by the API: the HTTP status and OpenAI's error object.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = "", std::string code = "");
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string type_, param_, code_;
};

/// A generation request, checked.
struct CompletionRequest {
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  std::string model;                  ///< as sent ("" when omitted)
  std::string prompt;                 ///< kCompletions
  std::vector<ChatMessage> messages;  ///< kChatCompletions
  /// Tokens to generate at most; nullopt: the completions default (16) or, for chat, until the
  /// context is full.
  std::optional<int64_t> max_tokens;
  double temperature = 1.0;  ///< 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;  ///< 0: no limit
  double repetition_penalty = 1.0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage: a last chunk with the token counts
  bool ignore_eos = false;     ///< vLLM's extension: generate past the end-of-sequence token (load tests)
};

/// Parses and checks a request body of `endpoint`; ApiError (400) naming the field otherwise.
CompletionRequest parse_completion_request(ApiEndpoint endpoint, const std::string& body);

/// Token counts of a finished request.
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

/// What identifies one response and its chunks.
struct ResponseHeader {
  std::string id;  ///< "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

/// A whole (non-streamed) response.
std::string completion_response_json(ApiEndpoint endpoint, const ResponseHeader& header, const std::string& text,
                                     FinishReason finish, const Usage& usage);

/// One streamed chunk carrying `text` (chat: as delta.content; the first chunk of a chat also
/// carries delta.role), and `finish` on the last one.
std::string completion_chunk_json(ApiEndpoint endpoint, const ResponseHeader& header, const std::string& text,
                                  bool first, std::optional<FinishReason> finish);

/// The closing chunk of stream_options.include_usage: no choices, the usage.
std::string usage_chunk_json(ApiEndpoint endpoint, const ResponseHeader& header, const Usage& usage);

/// `data: <json>\n\n`, one server-sent event.
std::string sse_event(const std::string& json);
/// `data: [DONE]\n\n`, the end of a stream.
std::string sse_done();

/// {"error": {"message", "type", "param", "code"}}.
std::string error_json(const ApiError& error);

/// GET /v1/models: one model.
std::string models_json(const std::string& id, int64_t created);

}  // namespace tandem
