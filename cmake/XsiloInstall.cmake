# `cmake --install <build> --prefix P --component xsilo`: the static
# libraries of src/, the public headers (include/xsilo), the `xsilo` binary
# and a CMake package, so that a downstream project does
#
#   find_package(xsilo REQUIRED)
#   target_link_libraries(app PRIVATE xsilo::xsilo)
#
# (README "Use xsilo from your C++ project", examples/consumer,
# tests/install). Everything here is in the component `xsilo`: the Python
# module's rules (python/CMakeLists.txt) install into the interpreter's
# site-packages, outside any prefix, and are left out by --component.
#
# Included from the top-level CMakeLists.txt after every layer is defined;
# the layers' own CMakeLists.txt know nothing of installing.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(XSILO_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/xsilo CACHE STRING
  "where cmake --install puts xsiloConfig.cmake (relative to the prefix)")
mark_as_advanced(XSILO_INSTALL_CMAKEDIR)

# Every library under src/, found by walking its directories, so that a
# layer split into more libraries is installed without an edit here. OBJECT
# libraries (xsilo_hybrid: its registration object must be linked whether
# or not anything references it) are installed as object files. Left out:
# xsilo_transport_grpc, whose objects are inside xsilo_transport, and
# INTERFACE libraries (xsilo_grpc_internal: private headers).
set(XSILO_INSTALL_SKIP xsilo_transport_grpc)
function(xsilo_collect_libs dir out)
  set(libs "")
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target ${targets})
    get_target_property(type ${target} TYPE)
    if(type MATCHES "^(STATIC|OBJECT)_LIBRARY$" AND NOT target IN_LIST XSILO_INSTALL_SKIP)
      list(APPEND libs ${target})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(subdir ${subdirs})
    xsilo_collect_libs(${subdir} sublibs)
    list(APPEND libs ${sublibs})
  endforeach()
  set(${out} ${libs} PARENT_SCOPE)
endfunction()
xsilo_collect_libs(${PROJECT_SOURCE_DIR}/src XSILO_INSTALL_LIBS)

# The umbrella target xsilo::xsilo: every library an application uses (all
# but the benchmark library, whose `bench plot` runs scripts of the source
# tree). Linking an OBJECT library brings its objects only to the target
# that links it directly, not through an INTERFACE one: the umbrella names
# the objects themselves, with $<TARGET_OBJECTS> (whose target name
# install(EXPORT) does not rewrite, hence one per interface).
add_library(xsilo_all INTERFACE)
set_target_properties(xsilo_all PROPERTIES EXPORT_NAME xsilo)
add_library(xsilo::xsilo ALIAS xsilo_all)
foreach(lib ${XSILO_INSTALL_LIBS})
  string(REPLACE "xsilo_" "" name ${lib})
  if(lib STREQUAL "xsilo_bench")
    continue()
  endif()
  target_link_libraries(xsilo_all INTERFACE ${lib})
  get_target_property(type ${lib} TYPE)
  if(type STREQUAL "OBJECT_LIBRARY")
    target_link_libraries(xsilo_all INTERFACE $<BUILD_INTERFACE:$<TARGET_OBJECTS:${lib}>>
      $<INSTALL_INTERFACE:$<TARGET_OBJECTS:xsilo::${name}>>)
  endif()
endforeach()

foreach(lib ${XSILO_INSTALL_LIBS})
  # xsilo::core, xsilo::transport, ... (also in this tree, for a project
  # that adds xsilo with add_subdirectory).
  string(REPLACE "xsilo_" "" name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${name})
  add_library(xsilo::${name} ALIAS ${lib})
  # The layers name their include directories by source path (xsilo_core:
  # include/ and src/); those hold for this tree only. Installed, the
  # include directory is the prefix's (INCLUDES DESTINATION below) and src/
  # is not there: a public header that includes a private one fails to
  # compile against the install (tests/install checks every header).
  get_target_property(dirs ${lib} INTERFACE_INCLUDE_DIRECTORIES)
  if(dirs)
    set(wrapped "")
    foreach(dir ${dirs})
      if(dir MATCHES "^\\$<")
        list(APPEND wrapped "${dir}")
      else()
        list(APPEND wrapped "$<BUILD_INTERFACE:${dir}>")
      endif()
    endforeach()
    set_target_properties(${lib} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${wrapped}")
  endif()
endforeach()

install(TARGETS ${XSILO_INSTALL_LIBS} xsilo_all EXPORT xsiloTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT xsilo
  OBJECTS DESTINATION ${CMAKE_INSTALL_LIBDIR}/xsilo-objects COMPONENT xsilo
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The whole public tree, read when installing (a header added or moved
# since configuring is installed as it is then).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/xsilo DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT xsilo FILES_MATCHING PATTERN "*.h")
if(XSILO_BUILD_TOOLS)
  install(TARGETS xsilo RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT xsilo)
endif()

install(EXPORT xsiloTargets NAMESPACE xsilo:: DESTINATION ${XSILO_INSTALL_CMAKEDIR}
  COMPONENT xsilo)
# xsiloConfig.cmake finds again what the static libraries link (see
# cmake/xsiloConfig.cmake.in); these say how this build found them.
set(XSILO_CONFIG_HAVE_TENSORPIPE ${XSILO_HAVE_TENSORPIPE})
set(XSILO_CONFIG_HAVE_UCX ${XSILO_HAVE_UCX})
set(XSILO_CONFIG_HAVE_MPI ${XSILO_HAVE_MPI})
set(XSILO_TP_TARGETS_DIR "")
if(XSILO_HAVE_TENSORPIPE AND XSILO_TP_TARGETS)
  get_filename_component(XSILO_TP_TARGETS_DIR ${XSILO_TP_TARGETS} DIRECTORY)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/xsiloConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/xsiloConfig.cmake INSTALL_DESTINATION ${XSILO_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/xsiloConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/xsiloConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/xsiloConfigVersion.cmake DESTINATION ${XSILO_INSTALL_CMAKEDIR}
  COMPONENT xsilo)
