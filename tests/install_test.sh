#!/usr/bin/env bash
# The installed package as a user meets it: `cmake --install` the build into a temporary prefix, then configure
# examples/ against it with only -DCMAKE_PREFIX_PATH, build and run both examples, and build a program that
# includes every installed header (each on its own, through <tinygpt/...>) and links tinygpt::tinygpt.
#   tests/install_test.sh BUILD_DIR SOURCE_DIR VERSION
set -euo pipefail
build=$1 src=$2 version=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" > "$tmp/install.log"
[ -x "$prefix/bin/tinygpt" ] || { echo "FAIL: no bin/tinygpt under the prefix"; exit 1; }
[ -f "$prefix/include/tinygpt/nn/attention.h" ] || { echo "FAIL: no include/tinygpt/nn/attention.h"; exit 1; }
installed_version=$("$prefix/bin/tinygpt" --version)
[[ "$installed_version" == *"$version"* ]] || { echo "FAIL: tinygpt --version says '$installed_version', not $version"; exit 1; }

# The examples, copied outside the source tree and configured as another project would be, plus a program that
# includes each public header on its own through the installed include path.
cp -r "$src/examples" "$tmp/examples"
mkdir -p "$tmp/headers"
(cd "$prefix/include" && find tinygpt -name '*.h' | sort) | while read -r h; do
  printf '#include <%s>\n' "$h" > "$tmp/headers/$(echo "$h" | tr '/.' '__').cpp"
done
printf 'int main() { return 0; }\n' > "$tmp/headers/main.cpp"
cat >> "$tmp/examples/CMakeLists.txt" <<'CMAKE'
file(GLOB header_checks ${CMAKE_CURRENT_SOURCE_DIR}/../headers/*.cpp)
add_executable(every_header ${header_checks})
target_link_libraries(every_header PRIVATE tinygpt::tinygpt)
CMAKE
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S "$tmp/examples" -B "$tmp/examples-build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  > "$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
grep "tinygpt $version from" "$tmp/configure.log"

echo "$(( $(ls "$tmp/headers" | wc -l) - 1 )) installed headers, each compiled on its own"
cmake --build "$tmp/examples-build" --parallel 2 > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }

"$tmp/examples-build/attention_from_ops"
"$tmp/examples-build/char_mlp" "$src/docs/DESIGN.md" 600 | tee "$tmp/mlp.log"
awk '/before training/ { before = $(NF - 2) } /after/ { after = $3 }
     END { if (!(after < before - 0.5)) { print "FAIL: val loss " before " -> " after ": the model did not learn"; exit 1 } }' \
  "$tmp/mlp.log"
echo "installed package: examples and every header built against $prefix"
