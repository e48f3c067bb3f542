// The qf-worker/1 worker side over a byte stream (stdin/stdout pipes).
#pragma once
#include <qfvulkan.h>

#include <string>

namespace qfv {
// Serves requests from in_fd, replies on out_fd, logs on stderr.  Returns the
// process exit code: 0 after bye or EOF, 2 after a frame/truncated/too_large
// error or a version mismatch (the connection is closed then).
int serve(int in_fd, int out_fd, const qfv_options &opts);
extern const char *const kImplementation;
} // namespace qfv
