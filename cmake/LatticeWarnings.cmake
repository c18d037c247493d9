# Warnings for every Lattice target; -Werror when LATTICE_WERROR is on (CI).
add_compile_options(-Wall -Wextra -Wpedantic -Wno-unused-parameter)
if(LATTICE_WERROR)
  add_compile_options(-Werror)
endif()
if(LATTICE_NATIVE)
  add_compile_options(-march=${LATTICE_MARCH})
endif()
# Without AVX-512 GCC warns that kernels' 64-byte Vec (src/kernels/simd.h) has another ABI when
# returned from a function it did not inline (the -O0 and sanitizer builds), with no source line
# for simd.h's pragma to cover. Vec never crosses a library boundary built with other flags.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_compile_options(-Wno-psabi)
endif()
