cmake_minimum_required(VERSION 3.25)
# The namespace rule for test files, run by ctest (test_namespaces_test):
#   cmake -DROOT=<source dir> -P tests/test_namespaces_check.cmake
# Every tests/<name>_test.cc opens its namespaces as preflight::<name>_test
# (or preflight::sim::<name>_test), never as preflight or preflight::sim
# themselves: its helpers (in an anonymous namespace inside) and its
# using-declarations then cannot meet another file's when the sanitizer tree
# compiles the suite in unity batches (CMAKE_UNITY_BUILD).
file(GLOB _files ${ROOT}/tests/*_test.cc)
if(NOT _files)
  message(FATAL_ERROR "no tests/*_test.cc found (is ROOT right?)")
endif()
set(_violations "")
foreach(_file ${_files})
  get_filename_component(_stem ${_file} NAME_WE)
  file(RELATIVE_PATH _rel ${ROOT} ${_file})
  file(STRINGS ${_file} _opens REGEX "^namespace preflight")
  if(NOT _opens)
    list(APPEND _violations "${_rel}: opens no namespace preflight::${_stem}")
  endif()
  foreach(_line ${_opens})
    if(NOT _line MATCHES "^namespace preflight(::sim)?::${_stem} {$")
      list(APPEND _violations "${_rel}: '${_line}' (use namespace preflight::${_stem} or preflight::sim::${_stem})")
    endif()
  endforeach()
endforeach()
if(_violations)
  string(REPLACE ";" "\n  " _text "${_violations}")
  message(FATAL_ERROR "test files outside their own namespace:\n  ${_text}")
endif()
message(STATUS "test namespaces: every test file keeps its own")
