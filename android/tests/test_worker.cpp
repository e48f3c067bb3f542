// qf-vulkan-worker end to end over real pipes: the golden request vectors in,
// replies checked against the golden result vectors and the protocol rules.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "codec.hpp"
#include "harness.hpp"

using qfv::json::Value;

static std::string g_exe, g_vec;

static std::vector<uint8_t> slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  return std::vector<uint8_t>(s.begin(), s.end());
}
static std::vector<uint8_t> vec(const char *name) {
  return slurp(g_vec + "/" + name + ".bin");
}

struct Child {
  pid_t pid = -1;
  int in = -1, out = -1;
  explicit Child(std::vector<std::string> args) {
    int a[2], b[2];
    if (pipe(a) != 0 || pipe(b) != 0) return;
    pid = fork();
    if (pid == 0) {
      dup2(a[0], 0);
      dup2(b[1], 1);
      close(a[0]);
      close(a[1]);
      close(b[0]);
      close(b[1]);
      std::vector<char *> argv;
      argv.push_back(const_cast<char *>(g_exe.c_str()));
      for (auto &s : args) argv.push_back(const_cast<char *>(s.c_str()));
      argv.push_back(nullptr);
      execv(g_exe.c_str(), argv.data());
      _exit(127);
    }
    close(a[0]);
    close(b[1]);
    in = a[1];
    out = b[0];
  }
  void send(const std::vector<uint8_t> &bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t r = write(in, bytes.data() + done, bytes.size() - done);
      if (r <= 0) return;
      done += static_cast<size_t>(r);
    }
  }
  qfv::Frame recv() {
    qfv::FdSource src(out);
    qfv::Frame f;
    if (!qfv::read_frame(src, f)) f.header["type"] = "<eof>";
    return f;
  }
  qfv::Frame ask(const std::vector<uint8_t> &bytes) {
    send(bytes);
    return recv();
  }
  int finish() { // closes stdin, returns the exit code
    if (in >= 0) close(in);
    in = -1;
    int st = 0;
    waitpid(pid, &st, 0);
    if (out >= 0) close(out);
    out = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  bool stdout_empty() {
    uint8_t c;
    return read(out, &c, 1) == 0;
  }
  ~Child() {
    if (in >= 0 || out >= 0) finish();
  }
};

static std::vector<uint8_t> msg(Value h, std::vector<std::vector<uint8_t>> bufs = {}) {
  return qfv::encode_message(std::move(h), bufs);
}
static Value req(const char *type, int64_t id) {
  Value h = Value::object();
  h["type"] = type;
  h["id"] = Value(id);
  return h;
}
static std::string type_of(const qfv::Frame &f) {
  return f.header.get("type") ? f.header.get("type")->s : "";
}
static std::string code_of(const qfv::Frame &f) {
  return f.header.get("code") ? f.header.get("code")->s : "";
}

static qfv::Frame golden(const char *name) {
  std::vector<uint8_t> b = vec(name);
  return qfv::decode_bytes(b.data(), b.size());
}

template <typename T> static std::vector<T> view(const std::vector<uint8_t> &b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

TEST(session_on_golden_vectors) {
  Child c({});
  qfv::Frame hello = c.ask(vec("hello_request"));
  CHECK(type_of(hello) == "hello");
  CHECK(hello.header.get("runtime")->s == "vulkan");
  CHECK(hello.header.get("protocol")->s == "qf-worker/1");
  CHECK(hello.header.get("memory_budget_bytes")->i > 0);
  CHECK(hello.header.get("accumulation")->get("integer")->s == "int64");
  CHECK(hello.header.get("accumulation")->get("real")->s == "float64");
  CHECK(hello.header.get("device")->get("backend")->s == "vulkan");
  CHECK(hello.header.get("limits")->get("max_message_bytes")->i > 0);
  CHECK(hello.header.get("storage_schemas")->a.size() == 3);
  CHECK(hello.header.get("kernels")->a.size() == 20);
  std::fprintf(stderr, "  hello: %s\n", qfv::json::dump(hello.header).c_str());

  qfv::Frame r = c.ask(vec("put_dense_u16"));
  CHECK_MSG(type_of(r) == "result" && r.header.get("handle")->i == 3, qfv::json::dump(r.header));
  r = c.ask(vec("put_weights"));
  CHECK_MSG(type_of(r) == "result" && r.header.get("integer_weights")->b ==
                                          golden("result_put_weights").header.get("integer_weights")->b,
            qfv::json::dump(r.header));
  // Frame pass: the golden result's outputs and pattern buffers; its per_frame
  // numbers are illustrative, so per_frame is checked against the golden put's
  // frames times the golden weights (to 1e-12).
  r = c.ask(vec("run_frame_pass"));
  qfv::Frame want = golden("result_frame_pass");
  CHECK_MSG(type_of(r) == "result", qfv::json::dump(r.header));
  CHECK(*r.header.get("outputs") == *want.header.get("outputs"));
  CHECK(r.header.get("id")->i == want.header.get("id")->i);
  CHECK(r.buffers.size() == 3 && want.buffers.size() == 3);
  if (r.buffers.size() == 3 && want.buffers.size() == 3) {
    auto a = view<double>(r.buffers[0]);
    auto fr = view<uint16_t>(golden("put_dense_u16").buffers[0]);
    auto wt = view<double>(golden("put_weights").buffers[0]);
    std::vector<double> b(4, 0.0);
    for (size_t f = 0; f < 2; ++f)
      for (size_t j = 0; j < 2; ++j)
        for (size_t p = 0; p < 9; ++p) b[f * 2 + j] += fr[f * 9 + p] * wt[j * 9 + p];
    CHECK(a.size() == b.size());
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
      CHECK(std::fabs(a[i] - b[i]) <= 1e-12 * std::fabs(b[i]));
    CHECK(r.buffers[1] == want.buffers[1]);
    CHECK(r.buffers[2] == want.buffers[2]);
  }
  r = c.ask(vec("run_gather"));
  want = golden("result_gather");
  CHECK(type_of(r) == "result" && *r.header.get("outputs") == *want.header.get("outputs") &&
        r.buffers == want.buffers);
  // The paired and packed payloads of the same frames give the same pass.
  qfv::Frame dense = c.ask(vec("run_frame_pass"));
  for (const char *name : {"put_paired", "put_packed"}) {
    qfv::Frame p = c.ask(vec(name));
    CHECK_MSG(type_of(p) == "result", std::string(name) + ": " + qfv::json::dump(p.header));
    int64_t h = golden(name).header.get("handle")->i;
    Value run = golden("run_frame_pass").header;
    run["chunk"] = Value(h);
    qfv::Frame out = c.ask(msg(run));
    CHECK_MSG(type_of(out) == "result" && out.buffers == dense.buffers, name);
  }
  // Empty weights: m = 0.
  r = c.ask(vec("put_weights_empty"));
  CHECK(type_of(r) == "result" && r.header.get("integer_weights")->b);
  qfv::Frame st = c.ask(vec("stats"));
  CHECK(type_of(st) == "stats" && st.header.get("handles")->i == 5);
  CHECK(st.header.get("resident_bytes")->get("packed")->i > 0);
  qfv::Frame ping = c.ask(vec("ping"));
  CHECK(type_of(ping) == "ping" && ping.header.get("id")->i == 16);
  // Errors that leave the worker usable.
  qfv::Frame e = c.ask(msg(req("launch", 40)));
  CHECK(type_of(e) == "error" && code_of(e) == "unsupported" && e.header.get("id")->i == 40);
  Value run = golden("run_frame_pass").header;
  run["chunk"] = Value(int64_t(99));
  e = c.ask(msg(run));
  CHECK(code_of(e) == "unknown_handle" && e.header.get("handle")->i == 99);
  Value bad = golden("put_dense_u16").header;
  bad["handle"] = Value(int64_t(50));
  e = c.ask(msg(bad, {std::vector<uint8_t>(34, 0)}));
  CHECK_MSG(code_of(e) == "bad_request", qfv::json::dump(e.header));
  bad["dtype"] = "float64";
  e = c.ask(msg(bad, {std::vector<uint8_t>(144, 0)}));
  CHECK(code_of(e) == "unsupported");
  bad["dtype"] = "uint16";
  bad["storage_schema"] = "dense-v9";
  e = c.ask(msg(bad, {std::vector<uint8_t>(36, 0)}));
  CHECK(code_of(e) == "unsupported");
  e = c.ask(vec("put_dense_u16")); // handle 3 again
  CHECK(code_of(e) == "bad_request");
  Value g = golden("run_gather").header;
  e = c.ask(msg(g, {std::vector<uint8_t>(8, 0xFF)})); // index -1
  CHECK(code_of(e) == "bad_request");
  r = c.ask(vec("release"));
  CHECK_MSG(type_of(r) == "result" && r.header.get("released")->a.size() == 2, qfv::json::dump(r.header));
  r = c.ask(vec("bye"));
  CHECK(type_of(r) == "bye" && r.header.get("id")->i == 17);
  CHECK(c.stdout_empty());
  CHECK(c.finish() == 0);
}

TEST(options_force_u32x2_and_device) {
  Child c({"--force-u32x2", "--device", "0"});
  qfv::Frame hello = c.ask(vec("hello_request"));
  CHECK(hello.header.get("accumulation")->get("integer")->s == "u32x2");
  Value w = Value::object();
  c.ask(vec("put_dense_u16"));
  // Integer weights take the exact path and report it.
  Value pw = golden("put_weights").header;
  std::vector<double> ones(18, 1.0);
  std::vector<uint8_t> wb(ones.size() * 8);
  std::memcpy(wb.data(), ones.data(), wb.size());
  qfv::Frame r = c.ask(msg(pw, {wb}));
  CHECK(r.header.get("integer_weights")->b);
  r = c.ask(vec("run_frame_pass"));
  CHECK_MSG(r.header.get("accumulation") && r.header.get("accumulation")->s == "u32x2",
            qfv::json::dump(r.header));
  CHECK(c.finish() == 0); // EOF on stdin = bye
  Child byname({"--device", "LLVMPIPE"});
  CHECK(type_of(byname.ask(vec("hello_request"))) == "hello");
  Child none({"--device", "no-such-gpu"});
  qfv::Frame e = none.ask(vec("hello_request"));
  CHECK_MSG(type_of(e) == "error", qfv::json::dump(e.header));
}

TEST(budget_refusal_over_pipes) {
  Child c({"--budget-bytes", "200"});
  qfv::Frame hello = c.ask(vec("hello_request"));
  CHECK(hello.header.get("memory_budget_bytes")->i == 200);
  qfv::Frame e = c.ask(vec("put_dense_u16"));
  CHECK_MSG(type_of(e) == "error" && code_of(e) == "budget", qfv::json::dump(e.header));
  qfv::Frame st = c.ask(vec("stats"));
  CHECK(st.header.get("handles")->i == 0);
  CHECK(type_of(c.ask(vec("ping"))) == "ping");
  CHECK(c.finish() == 0);
}

TEST(stream_errors_close) {
  {
    Child c({});
    qfv::Frame e = c.ask(vec("bad_magic"));
    CHECK(code_of(e) == "frame" && e.header.get("id")->type == qfv::json::Type::null);
    CHECK(c.finish() == 2);
  }
  {
    Child c({});
    c.send(vec("truncated_body"));
    close(c.in);
    c.in = -1;
    qfv::Frame e = c.recv();
    CHECK(code_of(e) == "truncated");
    CHECK(c.finish() == 2);
  }
  {
    Child c({});
    Value h = req("hello", 0);
    h["protocol"] = "qf-worker/9";
    qfv::Frame e = c.ask(msg(h));
    CHECK(code_of(e) == "version" && e.header.get("id")->i == 0);
    CHECK(c.finish() == 2);
  }
  {
    Child c({});
    std::vector<uint8_t> pre = {'Q', 'F', 'W', '1', 2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0}; // 2**40 body bytes
    qfv::Frame e = c.ask(pre);
    CHECK(code_of(e) == "too_large");
    CHECK(c.finish() == 2);
  }
  {
    Child c({});
    CHECK(c.finish() == 0); // EOF before any frame = bye
  }
  for (const char *name : {"float_in_header", "header_not_json", "invalid_utf8", "nonzero_buffer_padding"}) {
    Child c({});
    qfv::Frame e = c.ask(vec(name));
    CHECK_MSG(code_of(e) == "frame", name);
    CHECK(c.finish() == 2);
  }
}

TEST(list_devices) {
  int p[2];
  CHECK(pipe(p) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 1);
    execl(g_exe.c_str(), g_exe.c_str(), "--list-devices", static_cast<char *>(nullptr));
    _exit(127);
  }
  close(p[1]);
  char buf[4096] = {0};
  ssize_t n = read(p[0], buf, sizeof(buf) - 1);
  close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(n > 0 && std::strchr(buf, '\t') != nullptr);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  g_exe = argc > 1 ? argv[1] : "./qf-vulkan-worker";
  g_vec = argc > 2 ? argv[2] : "../docs/protocol/vectors";
  return harness::run_all();
}
