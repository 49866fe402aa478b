// Note [Chat formats]: each family's layout, byte for byte, and the family read off a template.
#include "tandem/serve/chat_format.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

const std::vector<ChatMessage> kChat = {{"system", "Be brief."}, {"user", "Hi"}};

TEST(ChatFormat, Llama3LayoutEndsAtTheAssistantsHeader) {
  EXPECT_EQ(render_chat(ChatFormat::kLlama3, kChat, "<|begin_of_text|>"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(chat_stop_strings(ChatFormat::kLlama3).front(), "<|eot_id|>");
}

TEST(ChatFormat, ChatMlLayoutEndsAtTheAssistantsTurn) {
  EXPECT_EQ(render_chat(ChatFormat::kChatMl, kChat),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chat_stop_strings(ChatFormat::kChatMl), std::vector<std::string>{"<|im_end|>"});
}

TEST(ChatFormat, PlainLayoutForModelsWithoutATemplate) {
  EXPECT_EQ(render_chat(ChatFormat::kPlain, kChat), "System: Be brief.\nUser: Hi\nAssistant:");
}

TEST(ChatFormat, FamilyIsReadOffTheTemplatesMarkers) {
  EXPECT_EQ(chat_format_of_template("{% for m in messages %}<|start_header_id|>{{ m.role }}..."), ChatFormat::kLlama3);
  EXPECT_EQ(chat_format_of_template("{% for m in messages %}{{'<|im_start|>' + m.role}}..."), ChatFormat::kChatMl);
  EXPECT_EQ(chat_format_of_template(""), ChatFormat::kPlain);
  EXPECT_EQ(chat_format_of_template("[INST] {{ m.content }} [/INST]"), ChatFormat::kPlain);
  EXPECT_STREQ(chat_format_name(ChatFormat::kChatMl), "chatml");
}

}  // namespace
}  // namespace tandem
