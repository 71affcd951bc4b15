// The tinygpt command line: see train/cli.h.
#include "train/cli.h"

#include <csignal>

int main(int argc, char** argv) {
  // A closed pipe on stdout is a failed write (EPIPE), answered with an error line and exit 1, not a silent death.
  std::signal(SIGPIPE, SIG_IGN);
  tinygpt::Cli cli;
  return cli.main(argc, argv);
}
