// The tinygpt command line: see train/cli.h.
#include "train/cli.h"

int main(int argc, char** argv) {
  tinygpt::Cli cli;
  CLI11_PARSE(cli.app, argc, argv);
  return cli.run();
}
