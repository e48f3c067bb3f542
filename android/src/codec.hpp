// qf-worker/1 framing: "QFW1", header_length u32 LE, body_length u64 LE,
// canonical JSON header, zero padding to 8, buffers each padded to 8.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.hpp"

namespace qfv {

struct Frame {
  json::Value header;
  std::vector<std::vector<uint8_t>> buffers;
};

// A receiver error: code is "frame", "truncated" or "too_large"; id is the
// request id when the header could be read (too_large), else null.
struct CodecError : std::runtime_error {
  std::string code;
  json::Value id;
  CodecError(std::string c, const std::string &msg, json::Value i = json::Value())
      : std::runtime_error(msg), code(std::move(c)), id(std::move(i)) {}
};

class Source {
public:
  virtual ~Source() = default;
  // Reads up to n bytes; fewer only at the end of the stream.
  virtual size_t read(uint8_t *dst, size_t n) = 0;
};

class MemorySource : public Source {
public:
  MemorySource(const uint8_t *p, size_t n) : p_(p), n_(n) {}
  size_t read(uint8_t *dst, size_t n) override;
  size_t remaining() const { return n_ - pos_; }

private:
  const uint8_t *p_;
  size_t n_;
  size_t pos_ = 0;
};

class FdSource : public Source {
public:
  explicit FdSource(int fd) : fd_(fd) {}
  size_t read(uint8_t *dst, size_t n) override;

private:
  int fd_;
};

constexpr uint64_t kMaxHeaderBytes = 16u << 20;
inline uint64_t pad8(uint64_t n) {
  return (n + 7) & ~uint64_t(7);
}

// Reads one frame.  Returns false on a clean end of stream before its first
// byte; throws CodecError otherwise.  max_message_bytes = 0: no limit.  After
// any error the connection is closed (the frame boundary is lost).
bool read_frame(Source &src, Frame &out, uint64_t max_message_bytes = 0);
// Decodes exactly one frame from a byte string (bytes after its end: frame).
Frame decode_bytes(const uint8_t *p, size_t n);
// Encodes header (emitted as canonical JSON as given; it must carry "buffers"
// when there are buffers) and buffers.
std::vector<uint8_t> encode_frame(const json::Value &header,
                                  const std::vector<std::vector<uint8_t>> &buffers);
// Sets header["buffers"] from the buffers (when there are any) and encodes.
std::vector<uint8_t> encode_message(json::Value header, const std::vector<std::vector<uint8_t>> &buffers);

} // namespace qfv
