#include "tandem/serve/chat_format.h"

#include "tandem/core/error.h"

namespace tandem {

// Note [Chat formats]
// An HF model folder says how its chats look in tokenizer_config.json's "chat_template", a Jinja
// program. Rather than run Jinja, tandem recognises the two layouts nearly every open chat model
// uses by their markers and renders them itself:
// - Llama 3 (Meta's model card, "Prompt format"): <|begin_of_text|>, then per message
//   <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>, then the assistant's header;
//   the reply ends with <|eot_id|> (or <|end_of_text|>).
// - ChatML (OpenAI's original chat markup, used by Qwen and many fine-tunes): per message
//   <|im_start|>{role}\n{content}<|im_end|>\n, then <|im_start|>assistant\n; the reply ends with
//   <|im_end|>.
// A folder without a template (tandem's own checkpoints, base models) gets a plain layout,
// "User: ...\nAssistant:", which a model trained on plain text continues sensibly; its reply ends
// at the next "\nUser:".

ChatFormat chat_format_of_template(const std::string& chat_template) {
  if (chat_template.find("<|start_header_id|>") != std::string::npos) return ChatFormat::kLlama3;
  if (chat_template.find("<|im_start|>") != std::string::npos) return ChatFormat::kChatMl;
  return ChatFormat::kPlain;
}

const char* chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kChatMl:
      return "chatml";
    case ChatFormat::kPlain:
      return "plain";
  }
  TANDEM_ASSERT(false, "chat format ", static_cast<int>(format));
  return "";
}

namespace {

std::string plain_role(const std::string& role) {
  if (role == "assistant") return "Assistant";
  if (role == "system") return "System";
  return "User";
}

}  // namespace

std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages, const std::string& bos) {
  std::string out;
  switch (format) {
    case ChatFormat::kLlama3:
      out = bos;
      for (const auto& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatFormat::kChatMl:
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      return out + "<|im_start|>assistant\n";
    case ChatFormat::kPlain:
      for (const auto& m : messages) out += plain_role(m.role) + ": " + m.content + "\n";
      return out + "Assistant:";
  }
  TANDEM_ASSERT(false, "chat format ", static_cast<int>(format));
  return out;
}

std::vector<std::string> chat_stop_strings(ChatFormat format) {
  switch (format) {
    case ChatFormat::kLlama3:
      return {"<|eot_id|>", "<|end_of_text|>"};
    case ChatFormat::kChatMl:
      return {"<|im_end|>"};
    case ChatFormat::kPlain:
      return {"\nUser:"};
  }
  TANDEM_ASSERT(false, "chat format ", static_cast<int>(format));
  return {};
}

}  // namespace tandem
