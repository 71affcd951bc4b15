// The chat page `serve` answers at /: serve/chat.html, built into the program (configured into chat_page.cpp).
#pragma once

namespace tinygpt {
extern const char* const kChatPage;
}
