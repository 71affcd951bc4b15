// The tinygpt command line: see train/cli.h.
#include <csignal>

#include "serve/http.h"
#include "train/cli.h"
#include "train/cli_serve.h"
#include "train/console.h"

int main(int argc, char** argv) {
  // A closed pipe on stdout is a failed write (EPIPE), answered with an error line and exit 1, not a silent death.
  std::signal(SIGPIPE, SIG_IGN);
  // A mapped file cut short by another process: one error line and exit 1, not a crash (train/console.h).
  std::signal(SIGBUS, tinygpt::on_bus_error);
  tinygpt::set_http_server(tinygpt::serve_http);  // serve/http.cpp, or its stand-in where cpp-httplib was missing
  tinygpt::Cli cli;
  return cli.main(argc, argv);
}
