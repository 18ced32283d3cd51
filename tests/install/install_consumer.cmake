# cmake -P script of the install.consumer test (tests/install/CMakeLists.txt).
# Inputs: XSILO_BUILD_DIR, XSILO_SOURCE_DIR, WORK_DIR, C_COMPILER,
# CXX_COMPILER, WITH_TOOLS. Each step stops the test with its output on
# failure. Nothing depends on timing.
set(prefix ${WORK_DIR}/prefix)
# A fresh prefix every run: headers left by an earlier install must not
# hide one that is no longer installed.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}")
  endif()
  message(STATUS "${name}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# The component `xsilo` only: the Python module installs outside any prefix.
step("install" ${CMAKE_COMMAND} --install ${XSILO_BUILD_DIR} --prefix ${prefix}
  --component xsilo)
foreach(file include/xsilo/version.h include/xsilo/core/status.h)
  if(NOT EXISTS ${prefix}/${file})
    message(FATAL_ERROR "not installed: ${prefix}/${file}")
  endif()
endforeach()
file(GLOB_RECURSE configs ${prefix}/*/xsiloConfig.cmake)
if(NOT configs)
  message(FATAL_ERROR "no xsiloConfig.cmake under ${prefix}")
endif()

# Configured with the prefix alone on the package path, outside this tree.
set(configure_args -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=RelWithDebInfo
  -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_CXX_COMPILER=${CXX_COMPILER})

step("configure examples/consumer" ${CMAKE_COMMAND} -S ${XSILO_SOURCE_DIR}/examples/consumer
  -B ${WORK_DIR}/consumer ${configure_args})
step("build examples/consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer -j 2)
step("run examples/consumer" ${WORK_DIR}/consumer/consumer)
message(STATUS "consumer printed:\n${step_output}")
foreach(line "store: hello from a Store"
    "inproc+memory: rank 0 got 'update' from rank 1: 1024 F32, sum 523776" "ok")
  string(FIND "${step_output}" "${line}\n" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "consumer did not print '${line}'")
  endif()
endforeach()

# Without optimization or debug information: only whether they compile.
step("configure headers" ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/headers
  -B ${WORK_DIR}/headers ${configure_args} -DCMAKE_BUILD_TYPE=)
step("build headers" ${CMAKE_COMMAND} --build ${WORK_DIR}/headers -j 2)

if(WITH_TOOLS)
  step("run bin/xsilo version" ${prefix}/bin/xsilo version)
  if(NOT step_output MATCHES "^xsilo [0-9]")
    message(FATAL_ERROR "bin/xsilo version printed:\n${step_output}")
  endif()
endif()

# The prefix holds a copy of every library and the binary (hundreds of MB):
# kept only when a step failed.
file(REMOVE_RECURSE ${prefix})
