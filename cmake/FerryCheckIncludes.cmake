# Include boundaries, checked at build time (cmake -P; ferry_cc_library and ferry_cc_test
# run it through a stamp file that their target depends on, see FerryHelpers.cmake):
#   1. a header under X/internal/ is private to X: only files under X/ may include it;
#   2. nothing under client/ includes a header under server/ (the client library ships
#      without the daemon's code);
#   3. ferryd's layers: server/gpu/ (the CUDA backend and GPU decode) sits above the
#      pipeline, so under server/ only server/gpu/ and server/service/ include it; the
#      pipeline knows a delivery ring only through the seam, so server/pipeline/ includes
#      nothing of server/transport/ but delivery_ring.h (its tests may, to build rings).
# Only includes that name a file of the source tree are checked ("absl/.../internal/..." is
# not ours). A breach is reported as "<file>:<line>: error: ..." and fails the build; the
# stamp is written only when every file passes, so the check runs again on the next build.
#
#   cmake -DROOT=<source root> -DFOLDER=<target's folder> -DFOLDER_HEADERS=<bool>
#         -DTARGET=<name> -DSTAMP=<file> -P FerryCheckIncludes.cmake <source files...>
# With FOLDER_HEADERS it also scans the headers of FOLDER (FOLDER/*.h, FOLDER/internal/**,
# FOLDER/include/**), globbed here so that a header added since configure is checked too.

cmake_minimum_required(VERSION 3.25)
foreach(var ROOT FOLDER TARGET STAMP)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "FerryCheckIncludes.cmake: -D${var}=... is missing")
  endif()
endforeach()

# The sources are the arguments after the script's path.
set(files)
set(seen_p OFF)
set(seen_script OFF)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(seen_script)
    list(APPEND files "${CMAKE_ARGV${i}}")
  elseif(seen_p)
    set(seen_script ON)
  elseif(CMAKE_ARGV${i} STREQUAL "-P")
    set(seen_p ON)
  endif()
endforeach()

if(FOLDER_HEADERS)
  set(header_globs *.h *.hh *.hpp *.cuh *.inc)  # FERRY_HEADER_GLOBS in FerryHelpers.cmake
  list(TRANSFORM header_globs PREPEND ${FOLDER}/ OUTPUT_VARIABLE here)
  list(TRANSFORM header_globs PREPEND ${FOLDER}/internal/ OUTPUT_VARIABLE internal)
  list(TRANSFORM header_globs PREPEND ${FOLDER}/include/ OUTPUT_VARIABLE include)
  file(GLOB headers ${here})
  file(GLOB_RECURSE nested ${internal} ${include})
  list(APPEND files ${headers} ${nested})
endif()
list(REMOVE_DUPLICATES files)

set(breaches 0)
foreach(file ${files})
  file(RELATIVE_PATH includer "${ROOT}" "${file}")
  get_filename_component(includer_dir "${file}" DIRECTORY)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*([<\"])([^>\"]+)[>\"]")
      continue()
    endif()
    set(quote "${CMAKE_MATCH_1}")
    set(name "${CMAKE_MATCH_2}")
    # Resolve as the compiler would: a quoted name first next to the includer, then from the
    # source root (the project's include directory).
    set(resolved "")
    if(quote STREQUAL "\"" AND EXISTS "${includer_dir}/${name}")
      set(resolved "${includer_dir}/${name}")
    elseif(EXISTS "${ROOT}/${name}")
      set(resolved "${ROOT}/${name}")
    else()
      continue()
    endif()
    cmake_path(NORMAL_PATH resolved)
    cmake_path(IS_PREFIX ROOT "${resolved}" NORMALIZE inside)
    if(NOT inside)
      continue()
    endif()
    file(RELATIVE_PATH header "${ROOT}" "${resolved}")

    set(rule "")
    # Rule 1; the deepest internal/ decides (X/internal/a/internal/b.h is private to
    # X/internal/a).
    if(header MATCHES "^(.*)/internal/")
      set(owner "${CMAKE_MATCH_1}")
      string(FIND "${includer}" "${owner}/" owner_at)
      if(NOT owner_at EQUAL 0)
        set(rule "'${owner}/internal/' is private to ${owner}/: only files under ${owner}/ may include it (make the header public in ${owner}/, or move the code that needs it)")
      endif()
    endif()
    # Rule 2.
    if(rule STREQUAL "" AND includer MATCHES "^client/" AND header MATCHES "^server/")
      set(rule "code under client/ must not include headers under server/ (the client ships without the daemon; shared code belongs in common/ or a top-level folder)")
    endif()
    # Rule 3.
    if(rule STREQUAL "" AND header MATCHES "^server/gpu/" AND includer MATCHES "^server/"
       AND NOT includer MATCHES "^server/(gpu|service)/")
      set(rule "server/gpu/ is ferryd's GPU layer, above the pipeline: only server/gpu/ and server/service/ include it (reach the GPU through server/transport/'s DeliveryRing or DeviceStage)")
    endif()
    if(rule STREQUAL "" AND includer MATCHES "^server/pipeline/" AND NOT includer MATCHES "_test\\.cc$"
       AND header MATCHES "^server/transport/" AND NOT header STREQUAL "server/transport/delivery_ring.h")
      set(rule "the pipeline knows a ring only through server/transport/delivery_ring.h (what a ring does to a batch reaches it as DeliveryRing::BatchPlan; rings are made by the caller's RingFactory)")
    endif()
    if(NOT rule STREQUAL "")
      # The line number, for editors that jump to "file:line:" (only ever for a breach).
      file(READ "${file}" text)
      string(FIND "${text}" "${line}" offset)
      string(SUBSTRING "${text}" 0 ${offset} before)
      string(REGEX REPLACE "[^\n]" "" newlines "${before}")
      string(LENGTH "${newlines}" line_no)
      math(EXPR line_no "${line_no} + 1")
      message(NOTICE "${includer}:${line_no}: error: includes \"${header}\": ${rule}")
      math(EXPR breaches "${breaches} + 1")
    endif()
  endforeach()
endforeach()

if(breaches GREATER 0)
  message(FATAL_ERROR "include boundary check of ${TARGET} failed: ${breaches} include(s) "
                      "break the rules in cmake/FerryCheckIncludes.cmake")
endif()
file(TOUCH "${STAMP}")
