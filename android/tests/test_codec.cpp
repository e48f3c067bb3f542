// The qf-worker/1 codec against the golden vectors in docs/protocol/vectors,
// plus canonical JSON cases and a mutation run (no crash, only codec errors).
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "codec.hpp"
#include "harness.hpp"
#include "json.hpp"

using qfv::json::Value;

static std::string g_dir;

static std::vector<uint8_t> slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  return std::vector<uint8_t>(s.begin(), s.end());
}

static std::string hex(const std::vector<uint8_t> &b) {
  static const char *d = "0123456789abcdef";
  std::string s;
  for (uint8_t c : b) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

static Value load_index() {
  std::vector<uint8_t> raw = slurp(g_dir + "/index.json");
  Value idx;
  std::string err;
  bool ok = qfv::json::parse(std::string(raw.begin(), raw.end()), idx, err);
  CHECK_MSG(ok, err);
  return idx;
}

TEST(golden_vectors) {
  Value idx = load_index();
  const Value *vs = idx.get("vectors");
  CHECK(vs != nullptr && vs->a.size() >= 30);
  CHECK(idx.get("protocol") && idx.get("protocol")->s == "qf-worker/1");
  if (!vs) return;
  int valid = 0, invalid = 0;
  for (const Value &v : vs->a) {
    const std::string name = v.get("name")->s;
    std::vector<uint8_t> bytes = slurp(g_dir + "/" + v.get("file")->s);
    CHECK_MSG(!bytes.empty(), name);
    if (const Value *code = v.get("error")) {
      ++invalid;
      std::string got = "none";
      try {
        qfv::decode_bytes(bytes.data(), bytes.size());
      } catch (const qfv::CodecError &e) {
        got = e.code;
      }
      CHECK_MSG(got == code->s, name + ": expected " + code->s + ", got " + got);
      continue;
    }
    ++valid;
    try {
      qfv::Frame f = qfv::decode_bytes(bytes.data(), bytes.size());
      CHECK_MSG(f.header == *v.get("header"), name + ": header " + qfv::json::dump(f.header));
      const Value *bh = v.get("buffers_hex");
      CHECK_MSG(bh && bh->a.size() == f.buffers.size(), name + ": buffer count");
      for (size_t i = 0; bh && i < bh->a.size() && i < f.buffers.size(); ++i) {
        CHECK_MSG(hex(f.buffers[i]) == bh->a[i].s, name + ": buffer " + std::to_string(i));
      }
      std::vector<uint8_t> again = qfv::encode_frame(*v.get("header"), f.buffers);
      CHECK_MSG(again == bytes, name + ": emitted bytes differ");
    } catch (const qfv::CodecError &e) {
      CHECK_MSG(false, name + ": " + e.code + ": " + e.what());
    }
  }
  std::fprintf(stderr, "  %d valid and %d invalid vectors\n", valid, invalid);
  CHECK(valid > 10 && invalid > 10);
}

TEST(canonical_json) {
  Value v = Value::object();
  v["zeta"] = Value(int64_t(-5));
  v["alpha"] = "caf\xc3\xa9 \xf0\x9f\x98\x80 /\x7f\x01\"\\\n";
  v["list"] = Value::array();
  v["list"].push(Value(true));
  v["list"].push(Value());
  CHECK(qfv::json::dump(v) ==
        "{\"alpha\":\"caf\\u00e9 \\ud83d\\ude00 /\x7f\\u0001\\\"\\\\\\n\",\"list\":[true,null],\"zeta\":-5}");
  Value back;
  std::string err;
  CHECK(qfv::json::parse(qfv::json::dump(v), back, err) && back == v);
  CHECK(qfv::json::parse("{\"a\" : 1.0, \"b\": 1e2}", back, err) && back.get("a")->i == 1 &&
        back.get("b")->i == 100);
  for (const char *badj : {"1.5", "NaN", "Infinity", "9007199254740992", "-9007199254740992", "[1,]",
                           "{\"a\":1", "\"\xff\"", "\"\\ud800\"", "01", "{} x", "\"\xed\xa0\x80\""}) {
    CHECK_MSG(!qfv::json::parse(badj, back, err), badj);
  }
  CHECK(qfv::json::parse("9007199254740991", back, err) && back.i == 9007199254740991LL);
  std::string deep(100000, '[');
  CHECK(!qfv::json::parse(deep, back, err));
}

TEST(round_trip_and_streaming) {
  Value h = Value::object();
  h["type"] = "put";
  h["id"] = Value(int64_t(3));
  std::vector<std::vector<uint8_t>> bufs = {{1, 2, 3}, {}, {9, 9, 9, 9, 9, 9, 9, 9, 9}};
  std::vector<uint8_t> bytes = qfv::encode_message(h, bufs);
  CHECK(bytes.size() % 8 == 0);
  qfv::Frame f = qfv::decode_bytes(bytes.data(), bytes.size());
  CHECK(f.buffers == bufs);
  // Two frames back to back on one stream; then a clean end.
  std::vector<uint8_t> two = bytes;
  two.insert(two.end(), bytes.begin(), bytes.end());
  qfv::MemorySource src(two.data(), two.size());
  qfv::Frame a, b, c;
  CHECK(qfv::read_frame(src, a) && qfv::read_frame(src, b) && !qfv::read_frame(src, c));
  // Bytes after the frame in a byte string: frame.
  std::string code;
  try {
    qfv::decode_bytes(two.data(), bytes.size() + 3);
  } catch (const qfv::CodecError &e) {
    code = e.code;
  }
  CHECK(code == "frame");
  // Over max_message_bytes: too_large from the prefix alone.
  qfv::MemorySource s2(bytes.data(), 16);
  code.clear();
  try {
    qfv::read_frame(s2, a, 32);
  } catch (const qfv::CodecError &e) {
    code = e.code;
  }
  CHECK(code == "too_large");
}

TEST(mutations_never_crash) {
  Value idx = load_index();
  const Value *vs = idx.get("vectors");
  if (!vs) return;
  std::mt19937_64 rng(1234);
  long errors = 0, ok = 0;
  for (const Value &v : vs->a) {
    std::vector<uint8_t> base = slurp(g_dir + "/" + v.get("file")->s);
    if (base.empty()) continue;
    for (int t = 0; t < 300; ++t) {
      std::vector<uint8_t> m = base;
      int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        size_t pos = rng() % m.size();
        switch (rng() % 3) {
        case 0: m[pos] = static_cast<uint8_t>(rng()); break;
        case 1: m.resize(pos); break;
        default: m.insert(m.begin() + static_cast<long>(pos), static_cast<uint8_t>(rng()));
        }
        if (m.empty()) m.push_back(0);
      }
      try {
        qfv::decode_bytes(m.data(), m.size());
        ++ok;
      } catch (const qfv::CodecError &e) {
        ++errors;
        CHECK(e.code == "frame" || e.code == "truncated");
      }
    }
  }
  std::fprintf(stderr, "  mutations: %ld decoded, %ld rejected\n", ok, errors);
}

int main(int argc, char **argv) {
  g_dir = argc > 1 ? argv[1] : "../docs/protocol/vectors";
  return harness::run_all();
}
