#pragma once
namespace ferry {
inline constexpr const char* kVersion = "0.3.0";
}
