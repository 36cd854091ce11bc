# include_boundary_test (see CMakeLists.txt):
#   cmake -DPROJECT_DIR=... -DFERRY_CMAKE_DIR=... -DWORK=... -DGENERATOR=... -DMAKE_PROGRAM=...
#         -DCXX=... -P run_test.cmake
# Each breach goes in after configure, so this also proves the next build catches it.
cmake_minimum_required(VERSION 3.25)

file(REMOVE_RECURSE ${WORK})
file(COPY ${PROJECT_DIR}/ DESTINATION ${WORK}/src)
set(src ${WORK}/src)

execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${src} -B ${WORK}/build -G ${GENERATOR}
          -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM} -DCMAKE_CXX_COMPILER=${CXX}
          -DFERRY_CMAKE_DIR=${FERRY_CMAKE_DIR}
  OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the test project failed:\n${out}")
endif()

# build(<what> <expected messages...>): builds; with no expected messages the build must
# succeed, otherwise it must fail and print each of them.
function(build what)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/build
                  OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE rc)
  if(ARGN STREQUAL "")
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${what}: the build failed, expected it to pass:\n${out}")
    endif()
    message(STATUS "${what}: builds")
    return()
  endif()
  if(rc EQUAL 0)
    message(FATAL_ERROR "${what}: the build passed, expected it to fail:\n${out}")
  endif()
  foreach(expected ${ARGN})
    string(FIND "${out}" "${expected}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${what}: the build failed without \"${expected}\":\n${out}")
    endif()
  endforeach()
  message(STATUS "${what}: fails as expected")
endfunction()

# put(<file> <text>): replaces a file of the tree (its mtime moves on, as an edit's would).
function(put file text)
  file(WRITE ${src}/${file} "${text}")
endfunction()

file(READ ${src}/other/other.cc other_cc)
file(READ ${src}/other/other.h other_h)
file(READ ${src}/client/client.cc client_cc)
file(READ ${src}/server/pipeline/pipeline.cc pipeline_cc)

build("clean tree (lib/ includes its own internal/, directly and relative)")

put(other/other.cc "#include \"lib/internal/secret.h\"\n${other_cc}")
build("other/other.cc includes lib/internal/secret.h"
      "other/other.cc:1: error: includes \"lib/internal/secret.h\""
      "'lib/internal/' is private to lib/"
      "include boundary check of boundary_other failed")
put(other/other.cc "${other_cc}")
build("other/other.cc restored")

put(other/other.h "${other_h}#include \"lib/internal/secret.h\"\n")
build("other/other.h (a header of the folder, in no source list) includes lib/internal/"
      "other/other.h:4: error: includes \"lib/internal/secret.h\"")
put(other/other.h "${other_h}")
build("other/other.h restored")

put(other/added.h "#pragma once\n\n#include \"../lib/internal/secret.h\"\n")
put(other/other.cc "#include \"other/added.h\"\n${other_cc}")
build("a header added after configure includes ../lib/internal/secret.h"
      "other/added.h:3: error: includes \"lib/internal/secret.h\"")
file(REMOVE ${src}/other/added.h)
put(other/other.cc "${other_cc}")
build("other/added.h removed")

put(client/client.cc "${client_cc}#include \"server/api.h\"\n")
build("client/client.cc includes server/api.h"
      "client/client.cc:4: error: includes \"server/api.h\""
      "code under client/ must not include headers under server/"
      "include boundary check of boundary_client failed")
put(client/client.cc "${client_cc}")
build("client/client.cc restored")

put(server/pipeline/pipeline.cc "${pipeline_cc}#include \"server/gpu/stage.h\"\n")
build("server/pipeline/pipeline.cc includes server/gpu/stage.h"
      "server/pipeline/pipeline.cc:4: error: includes \"server/gpu/stage.h\""
      "server/gpu/ is ferryd's GPU layer, above the pipeline"
      "include boundary check of boundary_pipeline failed")
put(server/pipeline/pipeline.cc "${pipeline_cc}#include \"server/transport/host_ring.h\"\n")
build("server/pipeline/pipeline.cc includes server/transport/host_ring.h"
      "server/pipeline/pipeline.cc:4: error: includes \"server/transport/host_ring.h\""
      "the pipeline knows a ring only through server/transport/delivery_ring.h")
put(server/pipeline/pipeline.cc "${pipeline_cc}")
build("server/pipeline/pipeline.cc restored")
