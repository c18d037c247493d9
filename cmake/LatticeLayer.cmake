# lattice_add_layer(NAME DEPS a b ...) builds src/NAME/*.cpp into the static library
# lattice_NAME. Each layer links only the layers above it in DESIGN.md.
function(lattice_add_layer name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB _sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  if(NOT _sources)
    # A layer with headers only (or not yet any sources) is an interface library.
    add_library(lattice_${name} INTERFACE)
    target_include_directories(lattice_${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(lattice_${name} INTERFACE ${ARG_DEPS})
    return()
  endif()
  add_library(lattice_${name} STATIC ${_sources})
  target_include_directories(lattice_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(lattice_${name} PUBLIC ${ARG_DEPS})
endfunction()

# lattice_sanitizer_environment(OUT) sets OUT to the ENVIRONMENT_MODIFICATION entry of a test in a
# sanitized build: the suppression file for third-party code (tests/sanitizers/), appended to the
# caller's TSAN_OPTIONS (thread) or LSAN_OPTIONS (address; leak checking stays on for Lattice's
# own code). Empty in other builds. One entry at most: thread and address never combine.
function(lattice_sanitizer_environment out)
  set(_supp ${PROJECT_SOURCE_DIR}/tests/sanitizers)
  if("thread" IN_LIST LATTICE_SANITIZE)
    set(${out} "TSAN_OPTIONS=string_append: suppressions=${_supp}/tsan.supp" PARENT_SCOPE)
  elseif("address" IN_LIST LATTICE_SANITIZE)
    set(${out} "LSAN_OPTIONS=string_append: suppressions=${_supp}/lsan.supp" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

# lattice_mpirun_sanitizer_environment(OUT): the same for a test that runs ranks under mpirun,
# plus, in an address build, leak checking off in those rank processes: OpenMPI unloads its
# components (dlclose) at MPI_Finalize, before LeakSanitizer reports, so the stacks of what they
# leave allocated end in "<unknown module>" and no suppression can name them. The in-process
# tests run the same Lattice code with leak checking on.
function(lattice_mpirun_sanitizer_environment out)
  lattice_sanitizer_environment(_environment)
  if("address" IN_LIST LATTICE_SANITIZE)
    list(APPEND _environment "ASAN_OPTIONS=string_append: detect_leaks=0")
  endif()
  set(${out} "${_environment}" PARENT_SCOPE)
endfunction()

# lattice_add_test_suite(NAME DEPS ...) builds tests/NAME/*_test.cpp into NAME_tests and
# registers every test case with CTest under the label NAME.
# SERIAL names tests (Suite.Name) that ctest runs with nothing beside them (RUN_SERIAL): those
# whose verdict rests on this machine's speed, such as a preflight that predicts a step's time.
function(lattice_add_test_suite name)
  cmake_parse_arguments(ARG "" "" "DEPS;LABELS;SERIAL" ${ARGN})
  file(GLOB _sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_test.cpp)
  if(NOT _sources)
    return()
  endif()
  add_executable(${name}_tests ${_sources})
  target_link_libraries(${name}_tests PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_include_directories(${name}_tests PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  # One OpenMP thread per test process: ctest runs tests side by side, and OpenMP teams that
  # oversubscribe the cores spin against each other (tests that need more set their budget).
  set(_properties LABELS "${name};${ARG_LABELS}" ENVIRONMENT "OMP_NUM_THREADS=1")
  lattice_sanitizer_environment(_sanitizer_environment)
  if(_sanitizer_environment)
    # A property of its own: gtest_discover_tests flattens a list-valued ENVIRONMENT.
    list(APPEND _properties ENVIRONMENT_MODIFICATION "${_sanitizer_environment}")
  endif()
  if(NOT ARG_SERIAL)
    gtest_discover_tests(${name}_tests PROPERTIES ${_properties} DISCOVERY_TIMEOUT 60)
    return()
  endif()
  list(JOIN ARG_SERIAL ":" _serial)
  gtest_discover_tests(${name}_tests TEST_FILTER "-${_serial}" PROPERTIES ${_properties}
                       DISCOVERY_TIMEOUT 60)
  foreach(_test IN LISTS ARG_SERIAL)
    add_test(NAME ${_test} COMMAND ${name}_tests --gtest_filter=${_test})
    set_tests_properties(${_test} PROPERTIES LABELS "${name};${ARG_LABELS}" ENVIRONMENT
                                             "OMP_NUM_THREADS=1" RUN_SERIAL TRUE)
    if(_sanitizer_environment)
      set_tests_properties(${_test} PROPERTIES ENVIRONMENT_MODIFICATION
                                               "${_sanitizer_environment}")
    endif()
  endforeach()
endfunction()
