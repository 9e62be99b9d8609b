// base/cpu_set: the cpulist text form, slices, and pinning a thread (in a thread of its
// own, so that the test process's mask is never changed) and restoring it.
#define BOOST_TEST_MODULE cpu_set
#include <boost/test/unit_test.hpp>

#include <cerrno>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "base/cpu_set.h"

using ferry::CpuSet;

namespace ferry {
// For Boost.Test's messages.
std::ostream& operator<<(std::ostream& os, const CpuSet& s) { return os << '{' << s.to_string() << '}'; }
}  // namespace ferry

BOOST_AUTO_TEST_CASE(parses_and_prints_cpulists) {
  BOOST_TEST(CpuSet::parse("0-3,8,10-11").cpus() == (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  BOOST_TEST(CpuSet::parse("0-3,8,10-11").to_string() == "0-3,8,10-11");
  BOOST_TEST(CpuSet::parse("5\n").to_string() == "5");  // as /sys/.../cpulist ends
  BOOST_TEST(CpuSet::parse(" 3, 1 ,2").to_string() == "1-3");
  BOOST_TEST(CpuSet::parse("").empty());
  BOOST_TEST(CpuSet({4, 2, 2, 3}).to_string() == "2-4");  // sorted, duplicates dropped
  BOOST_TEST(CpuSet({0, 2, 4}).to_string() == "0,2,4");
  BOOST_TEST(CpuSet({0, 2, 4}).contains(2));
  BOOST_TEST(!CpuSet({0, 2, 4}).contains(3));
  for (const char* bad : {"a", "1-", "-1", "3-1", "1,,2", "1.5", "2000000"}) {
    BOOST_CHECK_THROW(CpuSet::parse(bad), std::invalid_argument);
  }
  BOOST_CHECK_THROW(CpuSet({-1}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(slices_share_the_set) {
  const CpuSet s = CpuSet::parse("0-6");  // 7 cpus in 3 slices: 3, 2, 2
  BOOST_TEST(s.slice(0, 3).to_string() == "0-2");
  BOOST_TEST(s.slice(1, 3).to_string() == "3-4");
  BOOST_TEST(s.slice(2, 3).to_string() == "5-6");
  BOOST_TEST(s.slice(0, 1) == s);
  BOOST_CHECK_THROW(s.slice(3, 3), std::invalid_argument);
  BOOST_TEST(s.without_last(1).to_string() == "0-5");
  BOOST_TEST(s.without_last(7).empty());
  BOOST_TEST(s.without_last(0) == s);
}

BOOST_AUTO_TEST_CASE(pins_a_thread_and_restores_it) {
  const CpuSet process = ferry::allowed_cpus();
  BOOST_TEST_REQUIRE(!process.empty());
  BOOST_TEST_MESSAGE("this process may run on cpus " << process.to_string());
  const CpuSet last({process.cpus().back()});
  CpuSet inside, after, inherited;
  std::thread t([&] {
    ferry::pin_this_thread(last);
    inside = ferry::allowed_cpus();
    std::thread child([&] { inherited = ferry::allowed_cpus(); });  // created after the pin
    child.join();
    ferry::pin_this_thread(process);
    after = ferry::allowed_cpus();
  });
  t.join();
  BOOST_TEST(inside == last);
  BOOST_TEST(inherited == last);
  BOOST_TEST(after == process);
  BOOST_TEST(ferry::allowed_cpus() == process);  // the main thread was never touched
}

BOOST_AUTO_TEST_CASE(refuses_a_set_with_no_usable_cpu) {
  const CpuSet process = ferry::allowed_cpus();
  int outside = 0;
  while (process.contains(outside)) ++outside;  // a cpu id this process may not use
  std::vector<int> codes;  // Boost.Test's checks are made on the main thread only
  CpuSet after;
  std::thread t([&] {
    for (const CpuSet& s : {CpuSet(), CpuSet({outside})}) {
      try {
        ferry::pin_this_thread(s);
        codes.push_back(0);
      } catch (const std::system_error& e) {
        codes.push_back(e.code().value());
      }
    }
    after = ferry::allowed_cpus();
  });
  t.join();
  BOOST_TEST(codes == (std::vector<int>{EINVAL, EINVAL}));
  BOOST_TEST(after == process);  // unchanged by the refusals
}
