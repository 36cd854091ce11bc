# Two small helpers in the spirit of abseil's absl_cc_library: one CMake target per folder,
# explicit source lists, warnings on for project code only.

set(FERRY_COMMON_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
# CI builds with warnings as errors (gcc and clang), so that the tree stays warning-free.
option(FERRY_WARNINGS_AS_ERRORS "Treat warnings in ferry's own code as errors" OFF)
if(FERRY_WARNINGS_AS_ERRORS)
  list(APPEND FERRY_COMMON_WARNINGS -Werror)
endif()
set(FERRY_CHECK_INCLUDES_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/FerryCheckIncludes.cmake)

# Include boundaries (FerryCheckIncludes.cmake: X/internal/ is private to X/, client/ never
# includes server/), checked before <target> compiles: a breach fails the build, naming the
# file, the header and the rule. The check reruns when one of <srcs> changes and, with
# FOLDER_HEADERS, one of the folder's headers (a header added since configure is found by the
# script itself, which globs the folder again).
#   ferry_check_includes(<target> [FOLDER_HEADERS] SRCS ...)
set(FERRY_HEADER_GLOBS *.h *.hh *.hpp *.cuh *.inc)
function(ferry_check_includes target)
  cmake_parse_arguments(C "FOLDER_HEADERS" "" "SRCS" ${ARGN})
  set(files)
  foreach(src ${C_SRCS})
    if(src MATCHES "^\\$<")  # $<TARGET_OBJECTS:...> and other generator expressions
      continue()
    endif()
    get_filename_component(src "${src}" ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    if(src MATCHES "\\.(c|cc|cpp|cu|h|hh|hpp|cuh|inc)$" AND EXISTS "${src}")
      list(APPEND files "${src}")
    endif()
  endforeach()
  set(headers)
  if(C_FOLDER_HEADERS)
    set(dir ${CMAKE_CURRENT_SOURCE_DIR})
    list(TRANSFORM FERRY_HEADER_GLOBS PREPEND ${dir}/ OUTPUT_VARIABLE here)
    list(TRANSFORM FERRY_HEADER_GLOBS PREPEND ${dir}/internal/ OUTPUT_VARIABLE internal)
    list(TRANSFORM FERRY_HEADER_GLOBS PREPEND ${dir}/include/ OUTPUT_VARIABLE include)
    file(GLOB headers ${here})
    file(GLOB_RECURSE nested ${internal} ${include})
    list(APPEND headers ${nested})
  endif()
  set(stamp ${CMAKE_CURRENT_BINARY_DIR}/${target}.includes.stamp)
  add_custom_command(
    OUTPUT ${stamp}
    COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR} -DFOLDER=${CMAKE_CURRENT_SOURCE_DIR}
            -DFOLDER_HEADERS=${C_FOLDER_HEADERS} -DTARGET=${target} -DSTAMP=${stamp}
            -P ${FERRY_CHECK_INCLUDES_SCRIPT} ${files}
    DEPENDS ${files} ${headers} ${FERRY_CHECK_INCLUDES_SCRIPT}
    COMMENT "Checking the include boundaries of ${target}"
    VERBATIM)
  add_custom_target(${target}_includes DEPENDS ${stamp})
  add_dependencies(${target} ${target}_includes)
endfunction()

# ferry_cc_library(NAME <target> SRCS ... DEPS ... [PUBLIC_INCLUDE <dir>])
function(ferry_cc_library)
  cmake_parse_arguments(F "" "NAME" "SRCS;DEPS;DEFINES" ${ARGN})
  add_library(${F_NAME} STATIC ${F_SRCS})
  target_include_directories(${F_NAME} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${F_NAME} PUBLIC ${F_DEPS})
  target_compile_options(${F_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${FERRY_COMMON_WARNINGS}>)
  target_compile_definitions(${F_NAME} PUBLIC ${F_DEFINES})
  set_target_properties(${F_NAME} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  ferry_check_includes(${F_NAME} FOLDER_HEADERS SRCS ${F_SRCS})
endfunction()

# A test's own sources (long functions of gtest macros) compile with -Og and line tables
# only: a third of the time of -O2 -g, still with file:line in every backtrace and sanitizer
# report. The code under test keeps the build type's flags. Set FERRY_TEST_COPTS empty to
# step through a test with full debug information.
set(FERRY_TEST_COPTS -Og -g1 CACHE STRING "Extra compile options for the tests' own sources")

# The headers nearly every test includes (gtest, gmock, the standard library, abseil's
# basics), parsed once per build into a precompiled header that every ferry_cc_test reuses,
# instead of once per test: a fresh build compiles about 70 tests. The tests' own flags are
# the header's (FERRY_TEST_COPTS, warnings, -pthread, gtest's definitions); what a test's DEPS add
# (include paths, definitions) must not change these headers, and does not.
function(ferry_test_precompiled_header)
  if(TARGET ferry_test_pch)
    return()
  endif()
  set(anchor ${PROJECT_BINARY_DIR}/ferry_test_pch.cc)
  if(NOT EXISTS ${anchor})
    file(WRITE ${anchor} "// Compiles the tests' precompiled header (cmake/FerryHelpers.cmake).\n")
  endif()
  add_library(ferry_test_pch OBJECT ${anchor})
  target_link_libraries(ferry_test_pch PRIVATE GTest::gtest GTest::gtest_main absl::status)
  target_compile_options(ferry_test_pch PRIVATE ${FERRY_COMMON_WARNINGS} ${FERRY_TEST_COPTS} -pthread)
  target_precompile_headers(ferry_test_pch PRIVATE
    <algorithm> <atomic> <cstdint> <cstring> <filesystem> <fstream> <memory> <string> <thread>
    <vector> <gtest/gtest.h> <gmock/gmock.h> <absl/status/status.h> <absl/status/statusor.h>
    <absl/strings/str_cat.h> <absl/synchronization/mutex.h> <absl/time/time.h>)
endfunction()

# ferry_cc_test(NAME <target> SRCS ... DEPS ... [LABELS ...])
function(ferry_cc_test)
  cmake_parse_arguments(F "" "NAME" "SRCS;DEPS;LABELS;ENV" ${ARGN})
  add_executable(${F_NAME} ${F_SRCS})
  target_link_libraries(${F_NAME} PRIVATE ${F_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_options(${F_NAME} PRIVATE ${FERRY_COMMON_WARNINGS} ${FERRY_TEST_COPTS} -pthread)
  ferry_test_precompiled_header()
  target_precompile_headers(${F_NAME} REUSE_FROM ferry_test_pch)
  ferry_check_includes(${F_NAME} SRCS ${F_SRCS})
  add_test(NAME ${F_NAME} COMMAND ${F_NAME})
  set_tests_properties(${F_NAME} PROPERTIES TIMEOUT 300)
  if(F_LABELS)
    set_tests_properties(${F_NAME} PROPERTIES LABELS "${F_LABELS}")
  endif()
  if(F_ENV)
    set_tests_properties(${F_NAME} PROPERTIES ENVIRONMENT "${F_ENV}")
  endif()
endfunction()
