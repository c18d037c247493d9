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
# Intel oneMKL, a second GEMM library for lattice::matmul (scripts/setup.sh unpacks its PyPI
# wheels into .deps/mkl-<version>). LATTICE_WITH_MKL: AUTO uses it when setup found it, ON
# requires it, OFF builds with oneDNN alone. Linked as its pkg-config file for the LP64
# interface and the GNU OpenMP layer says (mkl-dynamic-lp64-gomp.pc), so MKL's threads are the
# same libgomp teams as Lattice's own loops and oneDNN's.
set(LATTICE_WITH_MKL AUTO CACHE STRING "Link Intel oneMKL as a second GEMM library: AUTO, ON, OFF")
set_property(CACHE LATTICE_WITH_MKL PROPERTY STRINGS AUTO ON OFF)
set(LATTICE_HAVE_MKL OFF)
if(NOT LATTICE_WITH_MKL STREQUAL "OFF" AND LATTICE_USE_OPENMP)
  file(GLOB _mkl_roots ${PROJECT_SOURCE_DIR}/.deps/mkl-*)
  find_path(MKL_INCLUDE_DIR mkl.h HINTS ${_mkl_roots} PATH_SUFFIXES include NO_DEFAULT_PATH)
  foreach(_part intel_lp64 gnu_thread core)
    find_library(MKL_${_part}_LIBRARY NAMES libmkl_${_part}.so.3 HINTS ${_mkl_roots}
                 PATH_SUFFIXES lib NO_DEFAULT_PATH)
  endforeach()
  if(MKL_INCLUDE_DIR AND MKL_intel_lp64_LIBRARY AND MKL_gnu_thread_LIBRARY AND MKL_core_LIBRARY)
    set(LATTICE_HAVE_MKL ON)
    add_library(MKL::mkl INTERFACE IMPORTED)
    set_target_properties(MKL::mkl PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES ${MKL_INCLUDE_DIR}
      INTERFACE_LINK_LIBRARIES "${MKL_intel_lp64_LIBRARY};${MKL_gnu_thread_LIBRARY};${MKL_core_LIBRARY};OpenMP::OpenMP_CXX;Threads::Threads;m;${CMAKE_DL_LIBS}"
      INTERFACE_COMPILE_DEFINITIONS LATTICE_HAVE_MKL)
    message(STATUS "Lattice: oneMKL found (${MKL_core_LIBRARY})")
  elseif(LATTICE_WITH_MKL STREQUAL "ON")
    message(FATAL_ERROR "LATTICE_WITH_MKL=ON but oneMKL is not in .deps/ ---> run scripts/setup.sh "
                        "(it downloads the mkl and mkl-include wheels from PyPI)")
  else()
    message(STATUS "Lattice: oneMKL not found (scripts/setup.sh unpacks it); GEMMs use oneDNN alone")
  endif()
endif()
