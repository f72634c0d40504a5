cmake_minimum_required(VERSION 3.25)
# The dependency rule for #include lines, run by ctest (layering_test):
#   cmake -DROOT=<source dir> -P tests/layering_check.cmake
# A file in a library's folder (and that library's public headers under
# include/preflight/<library>/) may include the public headers of the
# libraries listed for it, and no others. The link edges in CMakeLists.txt
# say the same for symbols; this catches inline code in headers too.
# Folders are read without their subfolders (simulator/ is the executor
# core, simulator/compare/ the comparison step).
set(_rules
  "src/recipe|recipe|recipe"
  "src/inventory|inventory|recipe inventory"
  "estimator|estimator|recipe inventory estimator"
  "planner|planner|recipe inventory estimator planner"
  "simulator|simulator|recipe inventory simulator"
  "simulator/compare||recipe inventory estimator planner simulator"
  "src/report|report|recipe inventory estimator planner simulator report"
  "src/cli||recipe inventory estimator planner simulator report")
set(_violations "")
foreach(_rule ${_rules})
  string(REPLACE "|" ";" _parts "${_rule}")
  list(GET _parts 0 _dir)
  list(GET _parts 1 _headers)
  list(GET _parts 2 _allowed)
  string(REPLACE " " ";" _allowed "${_allowed}")
  file(GLOB _files ${ROOT}/${_dir}/*.cc ${ROOT}/${_dir}/*.h)
  if(_headers)
    file(GLOB _public ${ROOT}/include/preflight/${_headers}/*.h)
    list(APPEND _files ${_public})
  endif()
  if(NOT _files)
    list(APPEND _violations "${_dir}: no sources found (is ROOT right?)")
  endif()
  foreach(_file ${_files})
    file(STRINGS ${_file} _includes REGEX "^#include \"preflight/[a-z_]+/")
    foreach(_line ${_includes})
      string(REGEX REPLACE "^#include \"preflight/([a-z_]+)/.*" "\\1" _library "${_line}")
      if(NOT _library IN_LIST _allowed)
        file(RELATIVE_PATH _rel ${ROOT} ${_file})
        list(APPEND _violations "${_rel}: ${_line} (library '${_library}' is not below ${_dir})")
      endif()
    endforeach()
  endforeach()
endforeach()
if(_violations)
  string(REPLACE ";" "\n  " _text "${_violations}")
  message(FATAL_ERROR "include edges that point up or sideways:\n  ${_text}")
endif()
message(STATUS "layering: every include edge points down")
