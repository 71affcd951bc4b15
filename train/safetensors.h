// The .safetensors format: an 8-byte little-endian header length, a JSON header mapping each tensor's name to
// its dtype, shape and byte range, an optional "__metadata__" object of string values, then the raw bytes.
// Other tools (the Python safetensors package, Hugging Face libraries) read what we write.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../autograd/tensor.h"

namespace tinygpt::safetensors {

struct Contents {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order, on the CPU
  std::map<std::string, std::string> metadata;

  /// The tensor called `name`, or an undefined tensor.
  Tensor find(const std::string& name) const;
};

/// Writes the tensors (any device; copied to the host) and metadata crash-safely: to `path`.tmp, flushed
/// to disk, then renamed over `path`, so a failure mid-write leaves any previous file intact.
void save(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata);

/// Reads and validates a whole file; throws naming the path and what is wrong (missing, truncated,
/// bad header, unknown dtype, sizes that do not match the shape, overlapping or out-of-range data).
Contents load(const std::filesystem::path& path);

}  // namespace tinygpt::safetensors
