// A tinygpt program built without cpp-httplib: `serve` says how to get it (train/cli_serve.cpp).
#include "serve/http.h"
#include "train/cli_serve.h"

namespace tinygpt {

void serve_http(ServeEngine&, const ServeArgs&) {
  throw Error(
      "this tinygpt was built without its HTTP server (libcpp-httplib-dev was missing when it was "
      "configured): install it (bash scripts/setup.sh) and build again");
}

}  // namespace tinygpt
