// Note [OpenAI API subset]: requests parsed as OpenAI's clients send them, refusals naming the field.
#include "tandem/serve/openai_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tandem {
namespace {

using nlohmann::json;

ApiError refusal(ApiEndpoint e, const std::string& body) {
  try {
    parse_completion_request(e, body);
  } catch (const ApiError& err) {
    return err;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "", "");
}

TEST(OpenAiApi, ParsesACompletionRequestAsTheClientSendsIt) {
  const auto r = parse_completion_request(
      ApiEndpoint::kCompletions,
      R"({"model": "m", "prompt": "Hello", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "stop": ["\n", "END"],
          "seed": 3, "stream": true, "stream_options": {"include_usage": true}, "top_k": 40,
          "repetition_penalty": 1.1, "n": 1, "presence_penalty": 0, "frequency_penalty": 0, "user": "u"})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "Hello");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_DOUBLE_EQ(r.temperature, 0.5);
  EXPECT_DOUBLE_EQ(r.top_p, 0.9);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_DOUBLE_EQ(r.repetition_penalty, 1.1);
  EXPECT_EQ(r.seed, 3u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  const auto d = parse_completion_request(ApiEndpoint::kCompletions, R"({"prompt": ["x"]})");
  EXPECT_EQ(d.prompt, "x");
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_DOUBLE_EQ(d.temperature, 1.0);
  EXPECT_FALSE(d.stream);
}

TEST(OpenAiApi, ParsesChatMessagesWithTextParts) {
  const auto r = parse_completion_request(ApiEndpoint::kChatCompletions, R"({"model": "m", "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
      "max_completion_tokens": 5})");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_EQ(r.max_tokens, 5);
}

TEST(OpenAiApi, RefusesBadRequestsNamingTheField) {
  struct Case {
    ApiEndpoint endpoint;
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {ApiEndpoint::kCompletions, R"({"prompt": "x", "max_tokens": -1})", "max_tokens"},
      {ApiEndpoint::kCompletions, R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
      {ApiEndpoint::kCompletions, R"({"prompt": "x", "temperature": 3})", "temperature"},
      {ApiEndpoint::kCompletions, R"({"prompt": "x", "top_p": 0})", "top_p"},
      {ApiEndpoint::kCompletions, R"({"prompt": "x", "bogus": 1})", "bogus"},
      {ApiEndpoint::kCompletions, R"({"prompt": "x", "n": 2})", "n"},
      {ApiEndpoint::kCompletions, R"({"prompt": "x", "frequency_penalty": 0.5})", "frequency_penalty"},
      {ApiEndpoint::kCompletions, R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", "stop"},
      {ApiEndpoint::kCompletions, R"({"prompt": 5})", "prompt"},
      {ApiEndpoint::kCompletions, R"({"max_tokens": 5})", "prompt"},
      {ApiEndpoint::kCompletions, R"({"prompt": "x", "stream": "yes"})", "stream"},
      {ApiEndpoint::kChatCompletions, R"({"messages": []})", "messages"},
      {ApiEndpoint::kChatCompletions, R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      {ApiEndpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content"},
      {ApiEndpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "tools": []})", "tools"},
  };
  for (const auto& c : cases) {
    const auto e = refusal(c.endpoint, c.body);
    EXPECT_EQ(e.status(), 400) << c.body;
    EXPECT_EQ(e.type(), "invalid_request_error") << c.body;
    EXPECT_EQ(e.param(), c.param) << c.body;
    EXPECT_NE(std::string(e.what()).find(c.param), std::string::npos) << e.what();
  }
  for (const char* body : {"{", "[1, 2]", "", "{\"prompt\": \"x\",}"}) {
    const auto e = refusal(ApiEndpoint::kCompletions, body);
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_NE(std::string(e.what()).find("JSON"), std::string::npos) << e.what();
  }
}

TEST(OpenAiApi, ResponsesAndChunksHaveTheApisShape) {
  const ResponseHeader h{"chatcmpl-1", 1700000000, "m"};
  const auto full =
      json::parse(completion_response_json(ApiEndpoint::kChatCompletions, h, "Hi", FinishReason::kLength, Usage{3, 2}));
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["choices"][0]["message"]["content"], "Hi");
  EXPECT_EQ(full["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(full["usage"]["total_tokens"], 5);
  const auto first = json::parse(completion_chunk_json(ApiEndpoint::kChatCompletions, h, "", true, std::nullopt));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const auto last =
      json::parse(completion_chunk_json(ApiEndpoint::kChatCompletions, h, "", false, FinishReason::kStop));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  const auto text =
      json::parse(completion_chunk_json(ApiEndpoint::kCompletions, h, "a\xff", false, std::nullopt));  // bad UTF-8
  EXPECT_EQ(text["object"], "text_completion");
  EXPECT_EQ(text["choices"][0]["text"].get<std::string>().substr(0, 1), "a");
  EXPECT_EQ(sse_event("{}"), "data: {}\n\n");
  const auto err = json::parse(error_json(ApiError(429, "rate_limit_error", "queue full", "", "queue_full")));
  EXPECT_EQ(err["error"]["type"], "rate_limit_error");
  EXPECT_EQ(err["error"]["code"], "queue_full");
  EXPECT_TRUE(err["error"]["param"].is_null());
  EXPECT_EQ(json::parse(models_json("tiny", 1))["data"][0]["id"], "tiny");
}

}  // namespace
}  // namespace tandem
