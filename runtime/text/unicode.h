// UTF-8 helpers for the tokenizer: validation, code point iteration, GPT-2's byte <->
// printable code point table (ByteLevel), Unicode normalization forms (utf8proc), and
// Rust's String::from_utf8_lossy. Threads: pure functions (the tables are built once).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::text {

// Length of the UTF-8 sequence starting at s[i] if it is valid there, else 0.
size_t utf8_sequence_length(std::string_view s, size_t i);
bool valid_utf8(std::string_view s);
// The code points of valid UTF-8 `s`, each as its own string.
std::vector<std::string> utf8_chars(std::string_view s);
std::string utf8_encode(uint32_t cp);
uint32_t utf8_decode_one(std::string_view s, size_t i, size_t* len);

// GPT-2's bytes_to_unicode: byte b -> the UTF-8 of a printable code point, and back
// (-1 for a code point outside the table).
const std::string& byte_to_unicode(uint8_t b);
int unicode_to_byte(uint32_t cp);

// "NFC", "NFD", "NFKC", "NFKD" of valid UTF-8.
std::string normalize(std::string_view s, const std::string& form);

// Invalid sequences replaced by U+FFFD as Rust's String::from_utf8_lossy does (one per
// maximal invalid prefix).
std::string utf8_lossy(std::string_view bytes);

}  // namespace ferry::text
