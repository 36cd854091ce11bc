# Fails when a file under client/ includes a header of server/ (the client libraries ship
# without the daemon's code; what both need lives in common/ or a top-level folder such as
# cuda/) or another folder's internal/ header (X/internal/ is private to X/).
#   cmake -DROOT=<source root> -P client_includes.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED ROOT)
  message(FATAL_ERROR "client_includes.cmake: -DROOT=<source root> is missing")
endif()

file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE ${ROOT}
     ${ROOT}/client/*.h ${ROOT}/client/*.hpp ${ROOT}/client/*.c ${ROOT}/client/*.cc
     ${ROOT}/client/*.cpp ${ROOT}/client/*.cu)
list(LENGTH files count)
if(count EQUAL 0)
  message(FATAL_ERROR "no C or C++ file under ${ROOT}/client: wrong ROOT?")
endif()

set(breaches 0)
foreach(file IN LISTS files)
  file(STRINGS ${ROOT}/${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"]")
      continue()
    endif()
    set(header ${CMAKE_MATCH_1})
    if(header MATCHES "^server/")
      message(NOTICE "${file}: includes \"${header}\": the client must not include server/ "
                     "headers (move what both need to common/ or a top-level folder)")
      math(EXPR breaches "${breaches} + 1")
    elseif(header MATCHES "^(.+)/internal/" AND EXISTS ${ROOT}/${header})
      set(owner ${CMAKE_MATCH_1})
      string(FIND "${file}" "${owner}/" at)
      if(NOT at EQUAL 0)
        message(NOTICE "${file}: includes \"${header}\": ${owner}/internal/ is private to "
                       "${owner}/ (make the header public there)")
        math(EXPR breaches "${breaches} + 1")
      endif()
    endif()
  endforeach()
endforeach()
if(breaches GREATER 0)
  message(FATAL_ERROR "${breaches} include(s) under client/ cross a boundary")
endif()
message(STATUS "${count} files under client/ include no server/ and no foreign internal/ header")
