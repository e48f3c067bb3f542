#include "codec.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace qfv {

size_t MemorySource::read(uint8_t *dst, size_t n) {
  size_t k = std::min(n, n_ - pos_);
  if (k) std::memcpy(dst, p_ + pos_, k);
  pos_ += k;
  return k;
}

size_t FdSource::read(uint8_t *dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd_, dst + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

namespace {
void read_exact(Source &src, uint8_t *dst, size_t n, const char *what) {
  if (src.read(dst, n) != n) {
    throw CodecError("truncated", std::string("the stream ended inside a frame (") + what + ")");
  }
}
uint32_t le32(const uint8_t *p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
uint64_t le64(const uint8_t *p) {
  return static_cast<uint64_t>(le32(p)) | static_cast<uint64_t>(le32(p + 4)) << 32;
}
bool all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i]) return false;
  return true;
}
} // namespace

bool read_frame(Source &src, Frame &out, uint64_t max_message_bytes) {
  uint8_t pre[16];
  size_t got = src.read(pre, 16);
  if (got == 0) return false;
  if (std::memcmp(pre, "QFW1", std::min<size_t>(got, 4)) != 0) {
    throw CodecError("frame", "bad magic: a frame starts with the bytes QFW1");
  }
  if (got < 16) throw CodecError("truncated", "the stream ended inside a frame prefix");
  uint32_t hlen = le32(pre + 4);
  uint64_t blen = le64(pre + 8);
  if (hlen > kMaxHeaderBytes) {
    throw CodecError("frame", "header_length " + std::to_string(hlen) + " exceeds the 16 MiB limit");
  }
  uint64_t head_total = pad8(16 + static_cast<uint64_t>(hlen));
  if (max_message_bytes != 0 && (blen > max_message_bytes || head_total + blen > max_message_bytes)) {
    throw CodecError("too_large", "frame of " + std::to_string(head_total + blen) +
                                      " bytes exceeds max_message_bytes " +
                                      std::to_string(max_message_bytes) + ": send smaller chunks");
  }
  std::vector<uint8_t> head(static_cast<size_t>(head_total - 16));
  read_exact(src, head.data(), head.size(), "header");
  std::string text(reinterpret_cast<const char *>(head.data()), hlen);
  json::Value header;
  std::string err;
  if (!json::parse(text, header, err)) throw CodecError("frame", "header is not valid JSON: " + err);
  if (header.type != json::Type::object) throw CodecError("frame", "header is not a JSON object");
  const json::Value *type = header.get("type");
  if (!type || !type->is_str()) throw CodecError("frame", "header has no string \"type\"");
  std::vector<uint64_t> lens;
  if (const json::Value *b = header.get("buffers")) {
    if (b->type != json::Type::array) throw CodecError("frame", "\"buffers\" is not a list");
    for (const auto &x : b->a) {
      if (!x.is_int() || x.i < 0) throw CodecError("frame", "\"buffers\" must hold non-negative integers");
      lens.push_back(static_cast<uint64_t>(x.i));
    }
  }
  if (!all_zero(head.data() + hlen, head.size() - hlen))
    throw CodecError("frame", "header padding is not zero");
  uint64_t want = 0;
  for (uint64_t l : lens) want += pad8(l);
  if (want != blen) {
    throw CodecError("frame", "body_length " + std::to_string(blen) +
                                  " differs from the buffers' padded sum " + std::to_string(want));
  }
  out.header = std::move(header);
  out.buffers.clear();
  for (uint64_t l : lens) {
    std::vector<uint8_t> buf(static_cast<size_t>(pad8(l)));
    read_exact(src, buf.data(), buf.size(), "body");
    if (!all_zero(buf.data() + l, buf.size() - l)) throw CodecError("frame", "buffer padding is not zero");
    buf.resize(static_cast<size_t>(l));
    out.buffers.push_back(std::move(buf));
  }
  return true;
}

Frame decode_bytes(const uint8_t *p, size_t n) {
  MemorySource src(p, n);
  Frame f;
  if (!read_frame(src, f)) throw CodecError("truncated", "no bytes");
  if (src.remaining() != 0) {
    throw CodecError("frame", std::to_string(src.remaining()) + " bytes follow the frame's end");
  }
  return f;
}

std::vector<uint8_t> encode_frame(const json::Value &header,
                                  const std::vector<std::vector<uint8_t>> &buffers) {
  std::string text = json::dump(header);
  uint64_t body = 0;
  for (const auto &b : buffers) body += pad8(b.size());
  uint64_t head_total = pad8(16 + text.size());
  std::vector<uint8_t> out(static_cast<size_t>(head_total + body), 0);
  std::memcpy(out.data(), "QFW1", 4);
  auto h = static_cast<uint32_t>(text.size());
  for (int i = 0; i < 4; ++i) out[4 + static_cast<size_t>(i)] = static_cast<uint8_t>(h >> (8 * i));
  for (int i = 0; i < 8; ++i) out[8 + static_cast<size_t>(i)] = static_cast<uint8_t>(body >> (8 * i));
  std::memcpy(out.data() + 16, text.data(), text.size());
  size_t pos = static_cast<size_t>(head_total);
  for (const auto &b : buffers) {
    if (!b.empty()) std::memcpy(out.data() + pos, b.data(), b.size());
    pos += static_cast<size_t>(pad8(b.size()));
  }
  return out;
}

std::vector<uint8_t> encode_message(json::Value header, const std::vector<std::vector<uint8_t>> &buffers) {
  if (!buffers.empty()) {
    json::Value lens = json::Value::array();
    for (const auto &b : buffers) lens.push(json::Value(static_cast<uint64_t>(b.size())));
    header["buffers"] = lens;
  }
  return encode_frame(header, buffers);
}

} // namespace qfv
