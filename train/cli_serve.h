// `tinygpt serve`: its options and their checks, and the run: the model loaded (ServeEngine), then the HTTP server
// (serve/http.cpp, linked into the tinygpt program only: the library carries no HTTP) answering on it.
#pragma once

#include <CLI/CLI.hpp>

#include "cli.h"

namespace tinygpt {

class ServeEngine;

void add_serve_options(CLI::App& cmd, ServeArgs& a);
/// The checks CLI11 cannot make; throws Error.
void validate_serve(const ServeArgs& a);
/// The HTTP server: answers on `engine` until SIGINT or SIGTERM. The tinygpt program sets it (set_http_server) before
/// the command line runs; a program built without one says so.
using HttpServer = void (*)(ServeEngine& engine, const ServeArgs& a);
void set_http_server(HttpServer server);
void run_serve(const ServeArgs& a);

}  // namespace tinygpt
