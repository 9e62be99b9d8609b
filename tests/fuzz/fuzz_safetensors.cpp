// A safetensors file (runtime/ckpt/safetensors.h): the input is the file. The header is
// read and checked, then every tensor's bytes read, whole and in a range.
#include "runtime/ckpt/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ferry::fuzz::scratch().fresh() + "/model.safetensors";
  ferry::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  ferry::fuzz::expect_result_or_named_error(path, [&] {
    ferry::runtime::SafetensorsReader reader(path);
    for (const ferry::runtime::SafetensorsEntry& e : reader.entries()) {
      const std::vector<char> bytes = reader.read(e);
      if (bytes.size() != e.end - e.begin)
        ferry::fuzz::fail("read() returned another size than the header says");
      if (bytes.size() >= 2) {
        char two[2];
        reader.read_range(e, bytes.size() - 2, 2, two);
        if (two[0] != bytes[bytes.size() - 2] || two[1] != bytes.back())
          ferry::fuzz::fail("read_range() differs from read()");
      }
    }
  });
  return 0;
}
