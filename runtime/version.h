#pragma once
namespace ferry {
inline constexpr const char* kVersion = "0.2.0";
}
