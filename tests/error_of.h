// Helpers for tests of messages: the error a call throws, and substring and membership
// checks. Boost.Test only (a call that throws nothing fails the test case).
#pragma once

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

namespace ferry::test {

// The message of the E that `f` throws; fails the test case when it throws nothing (an
// exception of another type propagates and fails it too).
template <class E = std::exception, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  BOOST_FAIL("no error thrown");
  return "";
}

inline bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

inline bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace ferry::test
