# Helpers shared by every folder: components of libzckpt, tests, fuzz targets.

# ---- layering, enforced by the include paths
# What the code of each top folder may include besides the headers beside it: the public
# header (include/zck.h) and the internal headers of the layers below it. The CLI and the
# Python package use the public API only; jobs/ headers stay inside jobs/; cuda/ is reached
# through its plain C headers (cuda/include: zck_cuda.h and the GPT-2 layout), never its
# internals. A folder missing here is a configure error.
set(ZCK_SEES_lib     include lib)
set(ZCK_SEES_formats include lib formats)
set(ZCK_SEES_jobs    include lib formats)
set(ZCK_SEES_saver   include lib formats)
set(ZCK_SEES_cuda    include lib cuda cuda/include)
set(ZCK_SEES_samples include lib formats saver cuda/include)
set(ZCK_SEES_tools   include)
set(ZCK_SEES_python  include)
set(ZCK_SEES_tests   include lib formats saver cuda cuda/include)
# Every internal header folder: what the tests (and their helper libraries) see.
set(ZCK_INCLUDE_DIRS)
foreach(d ${ZCK_SEES_tests})
  list(APPEND ZCK_INCLUDE_DIRS ${PROJECT_SOURCE_DIR}/${d})
endforeach()

# zck_layer_includes(TARGET PRIVATE|PUBLIC) : the include paths of the folder that defines
# TARGET (the top folder of the current CMakeLists.txt), from the table above.
function(zck_layer_includes target scope)
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  string(REGEX REPLACE "/.*" "" top "${rel}")
  if(NOT DEFINED ZCK_SEES_${top})
    message(FATAL_ERROR "zckpt: no layer for folder '${top}/': add ZCK_SEES_${top} to cmake/ZckHelpers.cmake")
  endif()
  foreach(d ${ZCK_SEES_${top}})
    target_include_directories(${target} ${scope} ${PROJECT_SOURCE_DIR}/${d})
  endforeach()
endfunction()

# zck_component(NAME SOURCES a.c b.c [LIBS dep...])
# An object library whose objects end up in libzckpt.
function(zck_component name)
  cmake_parse_arguments(Z "" "" "SOURCES;LIBS" ${ARGN})
  add_library(zck_${name} OBJECT ${Z_SOURCES})
  zck_layer_includes(zck_${name} PRIVATE)
  target_compile_options(zck_${name} PRIVATE $<$<COMPILE_LANGUAGE:C>:${ZCK_C_FLAGS}>)
  target_compile_definitions(zck_${name} PRIVATE _GNU_SOURCE)
  # libzckpt.so exports only zck.h's ZCK_API functions; our programs and tests link the
  # static library, where hidden symbols still resolve
  set_target_properties(zck_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON C_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(Z_LIBS)
    target_link_libraries(zck_${name} PUBLIC ${Z_LIBS})
  endif()
  set_property(GLOBAL APPEND PROPERTY ZCK_COMPONENTS zck_${name})
  set_property(GLOBAL APPEND PROPERTY ZCK_COMPONENT_LIBS ${Z_LIBS})
endfunction()

# Links every registered component into libzckpt (static, used by our own programs)
# and libzckpt.so (installed). Neither holds device code: that is zckpt_cuda (cuda/).
function(zck_finish_library)
  get_property(comps GLOBAL PROPERTY ZCK_COMPONENTS)
  get_property(libs GLOBAL PROPERTY ZCK_COMPONENT_LIBS)
  list(REMOVE_DUPLICATES libs)
  set(objs)
  foreach(c ${comps})
    list(APPEND objs $<TARGET_OBJECTS:${c}>)
  endforeach()
  foreach(kind STATIC SHARED)
    if(kind STREQUAL "STATIC")
      set(t zckpt)
    else()
      set(t zckpt_shared)
    endif()
    add_library(${t} ${kind} ${objs})
    target_include_directories(${t} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>)
    target_include_directories(${t} PUBLIC $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    target_link_libraries(${t} PUBLIC ${libs} Threads::Threads m)
    set_target_properties(${t} PROPERTIES OUTPUT_NAME zckpt VERSION ${PROJECT_VERSION}
      SOVERSION ${PROJECT_VERSION_MAJOR} LINKER_LANGUAGE C)
  endforeach()
endfunction()

# zck_program(NAME SOURCES ...) : an executable of ours linked to libzckpt, seeing the
# headers its folder's layer may include.
function(zck_program name)
  cmake_parse_arguments(Z "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${Z_SOURCES})
  zck_layer_includes(${name} PRIVATE)
  target_compile_options(${name} PRIVATE ${ZCK_C_FLAGS})
  target_compile_definitions(${name} PRIVATE _GNU_SOURCE)
  target_link_libraries(${name} PRIVATE zckpt ${Z_LIBS})
endfunction()

# zck_test(NAME SOURCES a.c ... [LABELS unit format ...] [ARGS ...])
# Exit code 77 means skipped (e.g. a GPU test on a machine without a GPU).
function(zck_test name)
  cmake_parse_arguments(Z "" "" "SOURCES;LABELS;ARGS;LIBS" ${ARGN})
  zck_program(${name} SOURCES ${Z_SOURCES} LIBS zck_testlib ${Z_LIBS})
  # tests build paths with snprintf into fixed buffers on purpose (a GCC warning; clang
  # has no such option and would warn about it)
  if(CMAKE_C_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${name} PRIVATE -Wno-format-truncation)
  endif()
  add_test(NAME ${name} COMMAND ${name} ${Z_ARGS})
  zck_test_properties(${name} "${Z_LABELS}")
endfunction()

# zck_script_test(NAME COMMAND ... [LABELS ...]) : a test that is a shell command.
function(zck_script_test name)
  cmake_parse_arguments(Z "" "" "COMMAND;LABELS" ${ARGN})
  add_test(NAME ${name} COMMAND ${Z_COMMAND})
  zck_test_properties(${name} "${Z_LABELS}")
endfunction()

# The tests of the edit loop, `ctest -L quick` (about a minute on two cores): unit, format,
# cli goldens and fuzz replay, without anything that trains, launches processes or injects
# faults. A test of those kinds that takes more than a few seconds is named in
# ZCK_NOT_QUICK_TESTS instead of getting the label.
set(ZCK_QUICK_KINDS unit format cli fuzz)
set(ZCK_HEAVY_KINDS e2e interop fault damage gpu wheel comm)
set(ZCK_NOT_QUICK_TESTS qa_cli test_autotp test_ds_roundtrip cli_verify_on_read)

function(zck_test_properties name labels)
  if(NOT labels)
    set(labels unit)
  endif()
  set(quick OFF)
  foreach(l IN LISTS labels)
    if(l IN_LIST ZCK_QUICK_KINDS)
      set(quick ON)
    endif()
  endforeach()
  foreach(l IN LISTS labels)
    if(l IN_LIST ZCK_HEAVY_KINDS)
      set(quick OFF)
    endif()
  endforeach()
  if(name IN_LIST ZCK_NOT_QUICK_TESTS)
    set(quick OFF)
  endif()
  if(quick)
    list(APPEND labels quick)
  endif()
  set_tests_properties(${name} PROPERTIES
    LABELS "${labels}"
    SKIP_RETURN_CODE 77
    ENVIRONMENT "ZCK_SOURCE_DIR=${PROJECT_SOURCE_DIR};ZCK_FIXTURES=${PROJECT_SOURCE_DIR}/tests/fixtures;ZCK_BIN=$<TARGET_FILE:zckpt-cli>;ASAN_OPTIONS=detect_leaks=1:abort_on_error=0;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
    TIMEOUT 600)
  if("interop" IN_LIST labels)
    # The real DeepSpeed / torch runs spawn several processes each: one at a time, so two
    # of them never fight over the cores (and the gloo rendezvous ports), with room to
    # finish on a loaded machine.
    set_tests_properties(${name} PROPERTIES RESOURCE_LOCK python_interop TIMEOUT 1800)
  endif()
endfunction()

# zck_fuzz_target(NAME SOURCE file.c CORPUS dir)
# Always: a replay program run by ctest (label fuzz) over every file of the corpus.
# With ZCK_FUZZ=ON and clang: also a libFuzzer binary fuzz_<NAME>.
function(zck_fuzz_target name)
  cmake_parse_arguments(Z "" "SOURCE;CORPUS" "" ${ARGN})
  zck_program(fuzz_${name}_replay SOURCES ${Z_SOURCE} ${PROJECT_SOURCE_DIR}/tests/common/fuzz_replay_main.c)
  add_test(NAME fuzz_${name}_replay COMMAND fuzz_${name}_replay ${Z_CORPUS})
  zck_test_properties(fuzz_${name}_replay "fuzz")
  if(ZCK_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
    zck_program(fuzz_${name} SOURCES ${Z_SOURCE})
    target_compile_options(fuzz_${name} PRIVATE -fsanitize=fuzzer)
    target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer)
  endif()
endfunction()
