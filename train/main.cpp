// The tinygpt command line: see train/cli.h.
#include "train/cli.h"

int main(int argc, char** argv) {
  tinygpt::Cli cli;
  return cli.main(argc, argv);
}
