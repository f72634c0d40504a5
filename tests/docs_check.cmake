cmake_minimum_required(VERSION 3.25)
# The docs check, run by ctest (docs_test):
#   cmake -DROOT=<source dir> -P tests/docs_check.cmake
# Fails when
#   - a source, test, doc or script cites a design note that is not in the
#     repository (the names are spelled in pieces below, so this file passes);
#   - a relative Markdown link in README.md or docs/*.md names a file that
#     does not exist;
#   - a citation "docs/formulas.md §N" (or "[formulas §N](...)") names a
#     section that docs/formulas.md does not have.
set(_problems "")
set(_absent "MATH" "DESIGN" "GUIDE")
file(GLOB_RECURSE _sources
  ${ROOT}/include/*.h ${ROOT}/src/*.cc ${ROOT}/src/*.h ${ROOT}/estimator/*.cc ${ROOT}/estimator/*.h
  ${ROOT}/planner/*.cc ${ROOT}/planner/*.h ${ROOT}/simulator/*.cc ${ROOT}/simulator/*.h
  ${ROOT}/tests/*.cc ${ROOT}/tests/*.h ${ROOT}/tests/*.txt ${ROOT}/tests/golden/* ${ROOT}/bench/*.cc ${ROOT}/bench/*.md
  ${ROOT}/docs/*.md ${ROOT}/scripts/* ${ROOT}/recipes/*.yaml ${ROOT}/README.md ${ROOT}/CMakeLists.txt)
file(READ ${ROOT}/docs/formulas.md _formulas)
string(REGEX MATCHALL "\n##+ [0-9]+(\\.[0-9]+)?[. ]" _headings "${_formulas}")
set(_sections "")
foreach(_h ${_headings})
  string(REGEX REPLACE "\n##+ ([0-9]+(\\.[0-9]+)?)[. ]" "\\1" _n "${_h}")
  list(APPEND _sections ${_n})
endforeach()
foreach(_file ${_sources})
  file(RELATIVE_PATH _rel ${ROOT} ${_file})
  file(READ ${_file} _text)
  foreach(_name ${_absent})
    string(FIND "${_text}" "${_name}.md" _at)
    if(NOT _at EQUAL -1)
      list(APPEND _problems "${_rel}: cites ${_name}.md, which is not in the repository")
    endif()
  endforeach()
  string(REGEX MATCHALL "(formulas\\.md|\\[formulas) §[0-9]+(\\.[0-9]+)?" _cites "${_text}")
  foreach(_cite ${_cites})
    string(REGEX REPLACE ".*§" "" _n "${_cite}")
    if(NOT _n IN_LIST _sections)
      list(APPEND _problems "${_rel}: cites docs/formulas.md §${_n}, which has no such section")
    endif()
  endforeach()
endforeach()
file(GLOB _docs ${ROOT}/docs/*.md)
foreach(_doc ${ROOT}/README.md ${_docs})
  get_filename_component(_dir ${_doc} DIRECTORY)
  file(RELATIVE_PATH _rel ${ROOT} ${_doc})
  file(READ ${_doc} _text)
  string(REGEX MATCHALL "\\]\\([^)#: ]+(#[^)]*)?\\)" _links "${_text}")
  foreach(_link ${_links})
    string(REGEX REPLACE "^\\]\\(([^)#]+).*" "\\1" _target "${_link}")
    if(NOT EXISTS ${_dir}/${_target})
      list(APPEND _problems "${_rel}: link to ${_target}, which does not exist")
    endif()
  endforeach()
endforeach()
if(_problems)
  string(REPLACE ";" "\n  " _text "${_problems}")
  message(FATAL_ERROR "docs check:\n  ${_text}")
endif()
list(LENGTH _sections _count)
message(STATUS "docs: links resolve, citations name one of the ${_count} sections of docs/formulas.md")
