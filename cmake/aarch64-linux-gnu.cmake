# Cross-compiles weft's layers below dist/ for 64-bit ARM Linux (./weft cross aarch64), to keep the
# code free of x86 assumptions. Only static libraries are built, nothing is linked: the header
# libraries (Eigen, fmt, nlohmann-json) and the CBLAS declarations come from the host, whose
# OpenBLAS declares the same API on every architecture.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# The host's CMake packages of those libraries (fmt's lies under the host's multiarch directory).
list(APPEND CMAKE_PREFIX_PATH /usr/lib/${CMAKE_HOST_SYSTEM_PROCESSOR}-linux-gnu/cmake)
