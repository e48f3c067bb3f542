// libFuzzer target over the qf-worker/1 parser: one-shot decoding and the stream reader.
// Any input must end in a decoded frame or a CodecError, never a crash, hang or UB
// (built with -fsanitize=fuzzer,address,undefined when QFV_FUZZ=ON; run by pytest for a
// few seconds with the golden vectors as seeds).
#include <cstddef>
#include <cstdint>
#include <exception>

#include "codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  try {
    qfv::Frame frame = qfv::decode_bytes(data, size);
    (void)frame;
  } catch (const qfv::CodecError &) {
  }
  try {
    qfv::MemorySource src(data, size);
    qfv::Frame frame;
    while (qfv::read_frame(src, frame, uint64_t(1) << 20)) {
    }
  } catch (const qfv::CodecError &) {
  }
  return 0;
}
