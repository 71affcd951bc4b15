// The HTTP side of `tinygpt serve` (cpp-httplib): routes, the API key, server-sent events, the chat page, and the
// signals that end it. What a request means is train/serve_api.h; what answers it is train/serve_engine.h.
#pragma once

#include "train/cli.h"

namespace tinygpt {

class ServeEngine;

/// Listens on a.host:a.port and answers on `engine` until SIGINT or SIGTERM: the first stops taking connections and
/// lets the request drawing finish (those waiting get 503), a second ends it at once.
void serve_http(ServeEngine& engine, const ServeArgs& a);

}  // namespace tinygpt
