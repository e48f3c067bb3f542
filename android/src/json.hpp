// Minimal JSON for qf-worker/1 headers: strict parser (integers only, within
// +-(2**53 - 1), valid UTF-8) and canonical emitter (sorted keys, no
// whitespace, \uXXXX lowercase for non-ASCII and control characters).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qfv::json {

enum class Type { null, boolean, integer, string, array, object };

struct Value {
  Type type = Type::null;
  bool b = false;
  int64_t i = 0;
  std::string s;
  std::vector<Value> a;
  std::map<std::string, Value> o; // std::map orders UTF-8 keys by code point

  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool v) : type(Type::boolean), b(v) {}
  Value(int v) : type(Type::integer), i(v) {}
  Value(int64_t v) : type(Type::integer), i(v) {}
  Value(uint64_t v) : type(Type::integer), i(static_cast<int64_t>(v)) {}
  Value(const char *v) : type(Type::string), s(v) {}
  Value(std::string v) : type(Type::string), s(std::move(v)) {}
  static Value array() {
    Value v;
    v.type = Type::array;
    return v;
  }
  static Value object() {
    Value v;
    v.type = Type::object;
    return v;
  }
  Value &operator[](const std::string &key) {
    type = Type::object;
    return o[key];
  }
  void push(Value v) {
    type = Type::array;
    a.push_back(std::move(v));
  }
  const Value *get(const std::string &key) const {
    if (type != Type::object) return nullptr;
    auto it = o.find(key);
    return it == o.end() ? nullptr : &it->second;
  }
  bool is_int() const { return type == Type::integer; }
  bool is_str() const { return type == Type::string; }
  bool operator==(const Value &x) const;
  bool operator!=(const Value &x) const { return !(*this == x); }
};

constexpr int64_t kMaxSafe = (int64_t(1) << 53) - 1;

// Parses one JSON text; false with a message on any error (including a
// non-integer number or one outside +-(2**53 - 1), invalid UTF-8, depth > 512).
bool parse(const std::string &text, Value &out, std::string &error);
// Canonical emission.
std::string dump(const Value &v);

} // namespace qfv::json
