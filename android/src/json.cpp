#include "json.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace qfv::json {

bool Value::operator==(const Value &x) const {
  if (type != x.type) return false;
  switch (type) {
  case Type::null: return true;
  case Type::boolean: return b == x.b;
  case Type::integer: return i == x.i;
  case Type::string: return s == x.s;
  case Type::array: return a == x.a;
  default: return o == x.o;
  }
}

namespace {

struct Parser {
  const std::string &t;
  size_t p = 0;
  std::string err;

  bool fail(const std::string &m) {
    if (err.empty()) err = m + " at byte " + std::to_string(p);
    return false;
  }
  void ws() {
    while (p < t.size() && (t[p] == ' ' || t[p] == '\t' || t[p] == '\n' || t[p] == '\r')) ++p;
  }
  bool lit(const char *w) {
    size_t n = std::char_traits<char>::length(w);
    if (t.compare(p, n, w) != 0) return fail("invalid literal");
    p += n;
    return true;
  }
  static void utf8(std::string &o, uint32_t c) {
    if (c < 0x80) {
      o += static_cast<char>(c);
    } else if (c < 0x800) {
      o += static_cast<char>(0xC0 | (c >> 6));
      o += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      o += static_cast<char>(0xE0 | (c >> 12));
      o += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      o += static_cast<char>(0xF0 | (c >> 18));
      o += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      o += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  bool hex4(uint32_t &v) {
    if (p + 4 > t.size()) return fail("short \\u escape");
    v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = t[p++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<uint32_t>(c - 'A' + 10);
      else
        return fail("bad hex digit in \\u escape");
    }
    return true;
  }
  // One UTF-8 sequence starting at p (validated: no overlongs, no surrogates).
  bool utf8_seq(std::string &o) {
    auto b0 = static_cast<unsigned char>(t[p]);
    int n = b0 >= 0xF0 && b0 <= 0xF4 ? 4 : b0 >= 0xE0 ? 3 : b0 >= 0xC2 && b0 < 0xE0 ? 2 : 0;
    if (n == 0 || p + static_cast<size_t>(n) > t.size()) return fail("invalid UTF-8");
    uint32_t c = b0 & (n == 2 ? 0x1Fu : n == 3 ? 0x0Fu : 0x07u);
    for (int k = 1; k < n; ++k) {
      auto b = static_cast<unsigned char>(t[p + static_cast<size_t>(k)]);
      if ((b & 0xC0) != 0x80) return fail("invalid UTF-8");
      c = (c << 6) | (b & 0x3Fu);
    }
    if ((n == 3 && (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF))) ||
        (n == 4 && (c < 0x10000 || c > 0x10FFFF))) {
      return fail("invalid UTF-8");
    }
    o.append(t, p, static_cast<size_t>(n));
    p += static_cast<size_t>(n);
    return true;
  }
  bool str(std::string &o) {
    ++p; // opening quote
    while (true) {
      if (p >= t.size()) return fail("unterminated string");
      auto c = static_cast<unsigned char>(t[p]);
      if (c == '"') {
        ++p;
        return true;
      }
      if (c < 0x20) return fail("control character in string");
      if (c == '\\') {
        if (++p >= t.size()) return fail("unterminated escape");
        char e = t[p++];
        switch (e) {
        case '"': o += '"'; break;
        case '\\': o += '\\'; break;
        case '/': o += '/'; break;
        case 'b': o += '\b'; break;
        case 'f': o += '\f'; break;
        case 'n': o += '\n'; break;
        case 'r': o += '\r'; break;
        case 't': o += '\t'; break;
        case 'u': {
          uint32_t v = 0;
          if (!hex4(v)) return false;
          if (v >= 0xD800 && v <= 0xDBFF) {
            uint32_t lo = 0;
            if (p + 2 > t.size() || t[p] != '\\' || t[p + 1] != 'u') return fail("lone surrogate");
            p += 2;
            if (!hex4(lo)) return false;
            if (lo < 0xDC00 || lo > 0xDFFF) return fail("lone surrogate");
            v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
          } else if (v >= 0xDC00 && v <= 0xDFFF) {
            return fail("lone surrogate");
          }
          utf8(o, v);
          break;
        }
        default: return fail("invalid escape");
        }
      } else if (c < 0x80) {
        o += static_cast<char>(c);
        ++p;
      } else if (!utf8_seq(o)) {
        return false;
      }
    }
  }
  bool num(Value &v) {
    size_t s = p;
    bool neg = false;
    if (t[p] == '-') {
      neg = true;
      ++p;
    }
    if (p >= t.size() || t[p] < '0' || t[p] > '9') return fail("invalid number");
    if (t[p] == '0' && p + 1 < t.size() && t[p + 1] >= '0' && t[p + 1] <= '9') return fail("leading zero");
    uint64_t acc = 0;
    bool big = false;
    while (p < t.size() && t[p] >= '0' && t[p] <= '9') {
      acc = acc * 10 + static_cast<uint64_t>(t[p] - '0');
      if (acc > static_cast<uint64_t>(kMaxSafe)) big = true;
      if (acc > (uint64_t(1) << 60)) acc = uint64_t(1) << 60;
      ++p;
    }
    if (p < t.size() && (t[p] == '.' || t[p] == 'e' || t[p] == 'E')) {
      // A fraction or exponent is accepted only when the value is an integer
      // (1.0, 1e2), as JavaScript's JSON.parse sees it; emitters never write one.
      if (t[p] == '.') {
        ++p;
        if (p >= t.size() || t[p] < '0' || t[p] > '9') return fail("invalid number");
        while (p < t.size() && t[p] >= '0' && t[p] <= '9') ++p;
      }
      if (p < t.size() && (t[p] == 'e' || t[p] == 'E')) {
        ++p;
        if (p < t.size() && (t[p] == '+' || t[p] == '-')) ++p;
        if (p >= t.size() || t[p] < '0' || t[p] > '9') return fail("invalid number");
        while (p < t.size() && t[p] >= '0' && t[p] <= '9') ++p;
      }
      double d = std::strtod(t.substr(s, p - s).c_str(), nullptr);
      if (!(std::fabs(d) <= static_cast<double>(kMaxSafe)) || std::floor(d) != d) {
        p = s;
        return fail("number whose value is not an integer within +-(2**53 - 1)");
      }
      v = Value(static_cast<int64_t>(d));
      return true;
    }
    if (big) {
      p = s;
      return fail("integer outside +-(2**53 - 1)");
    }
    v = Value(neg ? -static_cast<int64_t>(acc) : static_cast<int64_t>(acc));
    return true;
  }
  bool value(Value &v, int depth) {
    if (depth > 512) return fail("nesting too deep");
    ws();
    if (p >= t.size()) return fail("unexpected end");
    char c = t[p];
    if (c == '{') {
      ++p;
      v = Value::object();
      ws();
      if (p < t.size() && t[p] == '}') {
        ++p;
        return true;
      }
      while (true) {
        ws();
        if (p >= t.size() || t[p] != '"') return fail("expected a string key");
        std::string k;
        if (!str(k)) return false;
        ws();
        if (p >= t.size() || t[p] != ':') return fail("expected ':'");
        ++p;
        Value x;
        if (!value(x, depth + 1)) return false;
        v.o[k] = std::move(x);
        ws();
        if (p < t.size() && t[p] == ',') {
          ++p;
          continue;
        }
        if (p < t.size() && t[p] == '}') {
          ++p;
          return true;
        }
        return fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      ++p;
      v = Value::array();
      ws();
      if (p < t.size() && t[p] == ']') {
        ++p;
        return true;
      }
      while (true) {
        Value x;
        if (!value(x, depth + 1)) return false;
        v.a.push_back(std::move(x));
        ws();
        if (p < t.size() && t[p] == ',') {
          ++p;
          continue;
        }
        if (p < t.size() && t[p] == ']') {
          ++p;
          return true;
        }
        return fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v = Value(std::string());
      return str(v.s);
    }
    if (c == 't') {
      v = Value(true);
      return lit("true");
    }
    if (c == 'f') {
      v = Value(false);
      return lit("false");
    }
    if (c == 'n') {
      v = Value();
      return lit("null");
    }
    return num(v);
  }
};

void dump_str(std::string &o, const std::string &s) {
  o += '"';
  char buf[16];
  for (size_t p = 0; p < s.size();) {
    auto c = static_cast<unsigned char>(s[p]);
    if (c < 0x80) {
      switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20) {
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
      }
      ++p;
      continue;
    }
    // Strings come from the parser or from this program: valid UTF-8.
    int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    uint32_t cp = c & (n == 2 ? 0x1Fu : n == 3 ? 0x0Fu : 0x07u);
    for (int k = 1; k < n && p + static_cast<size_t>(k) < s.size(); ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(s[p + static_cast<size_t>(k)]) & 0x3Fu);
    }
    p += static_cast<size_t>(n);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      std::snprintf(buf, sizeof(buf), "\\u%04x", 0xD800 + (cp >> 10));
      o += buf;
      std::snprintf(buf, sizeof(buf), "\\u%04x", 0xDC00 + (cp & 0x3FF));
      o += buf;
    } else {
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      o += buf;
    }
  }
  o += '"';
}

void dump_to(std::string &o, const Value &v) {
  switch (v.type) {
  case Type::null: o += "null"; break;
  case Type::boolean: o += v.b ? "true" : "false"; break;
  case Type::integer: o += std::to_string(v.i); break;
  case Type::string: dump_str(o, v.s); break;
  case Type::array:
    o += '[';
    for (size_t k = 0; k < v.a.size(); ++k) {
      if (k) o += ',';
      dump_to(o, v.a[k]);
    }
    o += ']';
    break;
  case Type::object: {
    o += '{';
    bool first = true;
    for (const auto &kv : v.o) {
      if (!first) o += ',';
      first = false;
      dump_str(o, kv.first);
      o += ':';
      dump_to(o, kv.second);
    }
    o += '}';
    break;
  }
  }
}

} // namespace

bool parse(const std::string &text, Value &out, std::string &error) {
  Parser ps{text};
  Value v;
  if (!ps.value(v, 0)) {
    error = ps.err;
    return false;
  }
  ps.ws();
  if (ps.p != text.size()) {
    error = "trailing characters after the JSON value at byte " + std::to_string(ps.p);
    return false;
  }
  out = std::move(v);
  return true;
}

std::string dump(const Value &v) {
  std::string o;
  dump_to(o, v);
  return o;
}

} // namespace qfv::json
