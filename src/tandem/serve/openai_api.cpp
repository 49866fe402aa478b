#include "tandem/serve/openai_api.h"

#include <nlohmann/json.hpp>

#include <set>
#include <vector>

namespace tandem {

using nlohmann::json;

const char* finish_reason_name(FinishReason reason) { return reason == FinishReason::kStop ? "stop" : "length"; }

ApiError::ApiError(int status, std::string type, const std::string& message, std::string param, std::string code)
    : std::runtime_error(message),
      status_(status),
      type_(std::move(type)),
      param_(std::move(param)),
      code_(std::move(code)) {}

namespace {

ApiError bad_request(const std::string& message, const std::string& param) {
  return ApiError(400, "invalid_request_error", message, param);
}

// Note [OpenAI API subset]: the fields each endpoint takes.
const std::set<std::string>& known_fields(ApiEndpoint endpoint) {
  // Both endpoints' sampling and streaming fields, then each one's own.
  static const std::vector<std::string> kShared = {"model",
                                                   "max_tokens",
                                                   "temperature",
                                                   "top_p",
                                                   "n",
                                                   "stream",
                                                   "stop",
                                                   "seed",
                                                   "user",
                                                   "top_k",
                                                   "repetition_penalty",
                                                   "presence_penalty",
                                                   "frequency_penalty",
                                                   "stream_options",
                                                   "logprobs",
                                                   "logit_bias",
                                                   "ignore_eos"};
  const auto with = [](std::initializer_list<const char*> own) {
    std::set<std::string> out(kShared.begin(), kShared.end());
    out.insert(own.begin(), own.end());
    return out;
  };
  static const std::set<std::string> kCompletions = with({"prompt", "echo", "best_of", "suffix"});
  static const std::set<std::string> kChat = with({"messages", "max_completion_tokens"});
  return endpoint == ApiEndpoint::kCompletions ? kCompletions : kChat;
}

bool flag_in(const json& body, const char* key) {
  if (!body.contains(key) || body[key].is_null()) return false;
  if (!body[key].is_boolean()) throw bad_request(std::string(key) + " must be true or false", key);
  return body[key].get<bool>();
}

double number_in(const json& body, const char* key, double fallback, double lo, double hi, bool lo_open = false) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_number()) throw bad_request(std::string(key) + " must be a number", key);
  const double v = body[key].get<double>();
  if (v < lo || v > hi || (lo_open && v == lo))
    throw bad_request(std::string(key) + " must be in " + (lo_open ? "(" : "[") + json(lo).dump() + ", " +
                          json(hi).dump() + "], got " + body[key].dump(),
                      key);
  return v;
}

std::optional<int64_t> count_of(const json& body, const char* key) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_number_integer()) throw bad_request(std::string(key) + " must be an integer", key);
  const int64_t v = body[key].get<int64_t>();
  if (v < 1) throw bad_request(std::string(key) + " must be at least 1, got " + std::to_string(v), key);
  return v;
}

// Fields tandem accepts only at their neutral value (OpenAI's defaults).
void require_neutral(const json& body) {
  for (const char* key : {"presence_penalty", "frequency_penalty"})
    if (body.contains(key) && !body[key].is_null() && !(body[key].is_number() && body[key].get<double>() == 0.0))
      throw bad_request(std::string(key) + " is not supported; use repetition_penalty (1 = none)", key);
  if (body.contains("n") && !body["n"].is_null() && body["n"] != 1)
    throw bad_request("only n=1 is supported; send several requests instead", "n");
  if (body.contains("best_of") && !body["best_of"].is_null() && body["best_of"] != 1)
    throw bad_request("only best_of=1 is supported", "best_of");
  for (const char* key : {"logprobs", "suffix"})
    if (body.contains(key) && !body[key].is_null() && body[key] != false)
      throw bad_request(std::string(key) + " is not supported", key);
  if (body.contains("echo") && body["echo"] != false && !body["echo"].is_null())
    throw bad_request("echo is not supported", "echo");
  if (body.contains("logit_bias") && !body["logit_bias"].is_null() && !body["logit_bias"].empty())
    throw bad_request("logit_bias is not supported", "logit_bias");
}

std::vector<std::string> stop_strings(const json& body) {
  std::vector<std::string> out;
  if (!body.contains("stop") || body["stop"].is_null()) return out;
  const auto& s = body["stop"];
  if (s.is_string()) return {s.get<std::string>()};
  if (!s.is_array() || s.size() > 4)
    throw bad_request("stop must be a string or an array of at most 4 strings", "stop");
  for (const auto& e : s) {
    if (!e.is_string() || e.get<std::string>().empty()) throw bad_request("stop must hold non-empty strings", "stop");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::string prompt_of(const json& body) {
  if (!body.contains("prompt")) throw bad_request("prompt is required", "prompt");
  const auto& p = body["prompt"];
  if (p.is_string()) return p.get<std::string>();
  if (p.is_array() && p.size() == 1 && p[0].is_string()) return p[0].get<std::string>();
  throw bad_request("prompt must be a string (or an array of one string)", "prompt");
}

// content is a string or an array of {"type": "text", "text": ...} parts.
std::string content_of(const json& m, size_t i) {
  const std::string param = "messages[" + std::to_string(i) + "].content";
  if (!m.contains("content") || m["content"].is_null()) return "";
  const auto& c = m["content"];
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request(param + " must be a string or an array of text parts", param);
  std::string out;
  for (const auto& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      throw bad_request(param + ": only text parts ({\"type\": \"text\", \"text\": ...}) are supported", param);
    out += part["text"].get<std::string>();
  }
  return out;
}

std::vector<ChatMessage> messages_of(const json& body) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    throw bad_request("messages must be a non-empty array", "messages");
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < body["messages"].size(); ++i) {
    const auto& m = body["messages"][i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw bad_request(param + " must be an object with a role", param + ".role");
    std::string role = m["role"].get<std::string>();
    if (!kRoles.count(role))
      throw bad_request(param + ".role must be system, developer, user, assistant or tool, got " + role,
                        param + ".role");
    if (role == "developer") role = "system";
    out.push_back({role, content_of(m, i)});
  }
  return out;
}

json parse_object(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    throw bad_request(std::string("the body is not valid JSON: ") + e.what(), "");
  }
  if (!j.is_object()) throw bad_request("the body must be a JSON object", "");
  return j;
}

}  // namespace

CompletionRequest parse_completion_request(ApiEndpoint endpoint, const std::string& text) {
  const json body = parse_object(text);
  const auto& known = known_fields(endpoint);
  for (const auto& [key, value] : body.items())
    if (!known.count(key)) throw bad_request("unrecognized request argument supplied: " + key, key);
  require_neutral(body);
  CompletionRequest r;
  r.endpoint = endpoint;
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) throw bad_request("model must be a string", "model");
    r.model = body["model"].get<std::string>();
  }
  if (endpoint == ApiEndpoint::kCompletions)
    r.prompt = prompt_of(body);
  else
    r.messages = messages_of(body);
  r.max_tokens = count_of(body, "max_tokens");
  if (endpoint == ApiEndpoint::kChatCompletions && !r.max_tokens)
    r.max_tokens = count_of(body, "max_completion_tokens");
  r.temperature = number_in(body, "temperature", 1.0, 0.0, 2.0);
  r.top_p = number_in(body, "top_p", 1.0, 0.0, 1.0, /*lo_open=*/true);
  r.top_k = static_cast<int64_t>(number_in(body, "top_k", 0.0, -1.0, 1e9));
  if (r.top_k < 0) r.top_k = 0;  // vLLM's -1: no limit
  r.repetition_penalty = number_in(body, "repetition_penalty", 1.0, 0.0, 10.0, /*lo_open=*/true);
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) throw bad_request("seed must be an integer", "seed");
    r.seed = static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  r.stop = stop_strings(body);
  r.stream = flag_in(body, "stream");
  r.ignore_eos = flag_in(body, "ignore_eos");
  if (body.contains("stream_options") && body["stream_options"].is_object())
    r.include_usage = body["stream_options"].value("include_usage", false);
  return r;
}

namespace {

json header_json(ApiEndpoint endpoint, const ResponseHeader& h, bool chunk) {
  const char* object = endpoint == ApiEndpoint::kCompletions ? "text_completion"
                       : chunk                               ? "chat.completion.chunk"
                                                             : "chat.completion";
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

std::string completion_response_json(ApiEndpoint endpoint, const ResponseHeader& header, const std::string& text,
                                     FinishReason finish, const Usage& usage) {
  json j = header_json(endpoint, header, false);
  json choice = {{"index", 0}, {"finish_reason", finish_reason_name(finish)}, {"logprobs", nullptr}};
  if (endpoint == ApiEndpoint::kCompletions)
    choice["text"] = text;
  else
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(usage);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string completion_chunk_json(ApiEndpoint endpoint, const ResponseHeader& header, const std::string& text,
                                  bool first, std::optional<FinishReason> finish) {
  json j = header_json(endpoint, header, true);
  json choice = {{"index", 0}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish ? json(finish_reason_name(*finish)) : json(nullptr);
  if (endpoint == ApiEndpoint::kCompletions) {
    choice["text"] = text;
  } else {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (!finish && !first)) delta["content"] = text;
    choice["delta"] = delta;
  }
  j["choices"] = json::array({choice});
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string usage_chunk_json(ApiEndpoint endpoint, const ResponseHeader& header, const Usage& usage) {
  json j = header_json(endpoint, header, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return j.dump();
}

std::string sse_event(const std::string& json_text) { return "data: " + json_text + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string error_json(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type()}};
  err["param"] = e.param().empty() ? json(nullptr) : json(e.param());
  err["code"] = e.code().empty() ? json(nullptr) : json(e.code());
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string models_json(const std::string& id, int64_t created) {
  json m = {{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "tandem"}};
  return json{{"object", "list"}, {"data", json::array({m})}}.dump();
}

}  // namespace tandem
