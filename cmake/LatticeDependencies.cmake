# Every dependency is a Debian package installed by scripts/setup.sh.
find_package(Threads REQUIRED)
# Debian's oneDNN config module insists on OpenCL (its GPU runtime) even for CPU use; Lattice
# only uses the CPU engine, so the library is imported directly.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
add_library(DNNL::dnnl UNKNOWN IMPORTED)
set_target_properties(DNNL::dnnl PROPERTIES IMPORTED_LOCATION ${DNNL_LIBRARY}
                                            INTERFACE_INCLUDE_DIRECTORIES ${DNNL_INCLUDE_DIR})
find_package(MPI REQUIRED COMPONENTS C)
# The gloo transport; libgloo-dev's config module defines the imported target `gloo`.
find_package(Gloo REQUIRED)
# The job secret's HMAC on every gloo connection (lattice launch).
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
# The rendezvous store across machines (Gloo's RedisStore; libhiredis-dev, imported directly).
find_path(HIREDIS_INCLUDE_DIR hiredis/hiredis.h REQUIRED)
find_library(HIREDIS_LIBRARY hiredis REQUIRED)
add_library(Hiredis::hiredis UNKNOWN IMPORTED)
set_target_properties(Hiredis::hiredis PROPERTIES IMPORTED_LOCATION ${HIREDIS_LIBRARY}
                                                  INTERFACE_INCLUDE_DIRECTORIES ${HIREDIS_INCLUDE_DIR})
# The machine's cores and NUMA nodes (lattice doctor); Debian's libhwloc-dev, imported directly.
find_path(HWLOC_INCLUDE_DIR hwloc.h REQUIRED)
find_library(HWLOC_LIBRARY hwloc REQUIRED)
add_library(HWLOC::hwloc UNKNOWN IMPORTED)
set_target_properties(HWLOC::hwloc PROPERTIES IMPORTED_LOCATION ${HWLOC_LIBRARY}
                                              INTERFACE_INCLUDE_DIRECTORIES ${HWLOC_INCLUDE_DIR})
find_package(nlohmann_json REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(CLI11 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
if(LATTICE_USE_OPENMP)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
endif()
if(LATTICE_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(LATTICE_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
