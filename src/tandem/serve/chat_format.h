#pragma once
// Chat prompts: the messages of /v1/chat/completions laid out as the model was trained to read
// them. Two families are built in, chosen from the model folder's tokenizer_config.json
// (Note [Chat formats]); no template engine runs.

#include <string>
#include <vector>

namespace tandem {

/// One message of a conversation.
struct ChatMessage {
  std::string role;  ///< "system", "user", "assistant" (or "tool": shown to the model like a user turn)
  std::string content;
};

/// The prompt layouts tandem knows.
enum class ChatFormat {
  kLlama3,  ///< <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
  kChatMl,  ///< <|im_start|>role\ncontent<|im_end|>\n (Qwen, many fine-tunes)
  kPlain,   ///< "User: ...\nAssistant: ..." for models trained on plain text (tandem's byte models)
};

/// The family of a chat_template text (tokenizer_config.json's "chat_template"); kPlain when it is
/// empty or of neither family.
ChatFormat chat_format_of_template(const std::string& chat_template);

/// "llama3", "chatml", "plain".
const char* chat_format_name(ChatFormat format);

/// The prompt text for `messages`, ending where the assistant's reply begins. `bos` is prepended
/// when the format starts with it (Llama 3's <|begin_of_text|>); "" leaves it to the tokenizer.
std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages, const std::string& bos = "");

/// The strings that end the assistant's turn in `format` (generation stops there; not emitted).
std::vector<std::string> chat_stop_strings(ChatFormat format);

}  // namespace tandem
