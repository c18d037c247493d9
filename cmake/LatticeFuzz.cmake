# LATTICE_BUILD_FUZZ builds the libFuzzer targets of tests/fuzz/ (scripts/fuzz.sh). libFuzzer
# comes with clang, so the build must use it (CC=clang CXX=clang++, a build directory of its
# own). Every target is built with the fuzzer's coverage instrumentation and ASan + UBSan, so a
# reader's memory error or undefined behaviour on a hostile file is a crash the fuzzer keeps.
# OpenMP is off: the readers use none, and the fuzzer runs one input at a time.
if(LATTICE_BUILD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "LATTICE_BUILD_FUZZ needs clang (libFuzzer); configure a separate build "
                        "directory with CC=clang CXX=clang++, as scripts/fuzz.sh does")
  endif()
  if(NOT LATTICE_SANITIZE)
    set(LATTICE_SANITIZE "address;undefined")
  endif()
  if("thread" IN_LIST LATTICE_SANITIZE)
    message(FATAL_ERROR "LATTICE_BUILD_FUZZ runs under ASan + UBSan, not 'thread'")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
