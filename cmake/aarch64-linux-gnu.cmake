# Cross-compiling for 64-bit ARM Linux with Debian's toolchain (g++-aarch64-linux-gnu, and the arm64 libraries of
# Debian's multiarch, e.g. libfmt-dev:arm64). With qemu-user installed, CTest runs the tests under emulation:
#   cmake -S . -B build-arm -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake && ctest --test-dir build-arm
# scripts/test_aarch64.sh does all of it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Programs and headers from the host, libraries for the target.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
find_program(TINYGPT_QEMU_AARCH64 qemu-aarch64)
if(TINYGPT_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${TINYGPT_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
endif()
