# Warnings for every Lattice target; -Werror when LATTICE_WERROR is on (CI).
add_compile_options(-Wall -Wextra -Wpedantic -Wno-unused-parameter)
if(LATTICE_WERROR)
  add_compile_options(-Werror)
endif()
if(LATTICE_NATIVE)
  add_compile_options(-march=${LATTICE_MARCH})
endif()
