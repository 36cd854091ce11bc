# Installing for users outside this tree: the CMake config package (find_package(ferry) ->
# ferry::client, ferry::c), pkg-config files, and the Debian packages CPack builds from the
# install components (scripts/package.sh; docs/install.md):
#   ferryd           component daemon: ferryd, ferryctl, systemd unit, sysusers, tmpfiles,
#                    /etc/ferry/ferryd.conf, operator docs
#   libferry1        component libs:   libferry.so.1 (C ABI), libferry_client.so.0 (C++)
#   libferry-dev     component dev:    headers, linker names, pkg-config, CMake package
#   python3-ferry    component python: the `ferry` package for Debian's python3
# Packages follow Debian's layout when configured with CMAKE_INSTALL_PREFIX=/usr (what
# scripts/package.sh does): libraries in lib/<multiarch>, the config in /etc.
include(CMakePackageConfigHelpers)

set(FERRY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)
install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION ${FERRY_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/ferryConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/ferryConfig.cmake
  INSTALL_DESTINATION ${FERRY_CMAKE_DIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/ferryConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/ferryConfig.cmake
              ${PROJECT_BINARY_DIR}/cmake/ferryConfigVersion.cmake
        DESTINATION ${FERRY_CMAKE_DIR} COMPONENT dev)

# pkg-config files locate the prefix from their own directory, so an unpacked tree works
# wherever it lies.
file(RELATIVE_PATH FERRY_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
foreach(pc ferry ferry-client)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${pc}.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc
                 @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endforeach()

# --- CPack: Debian packages ---------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ferry)
set(CPACK_PACKAGE_VENDOR "ferry")
set(CPACK_PACKAGE_CONTACT "ferry maintainers <ferry@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "per-node data-prefetch daemon for GPU training")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_COMPONENTS_ALL daemon libs dev python)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
# Run-time dependencies of the binaries from dpkg-shlibdeps (dpkg-dev).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME ferryd)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION net)
set(CPACK_COMPONENT_DAEMON_DESCRIPTION
    "ferry data-prefetch daemon (ferryd), ferryctl and the systemd service\n ferryd reads and decodes training samples once per machine with NUMA-pinned\n workers and hands batches to every trainer process on it.")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/deploy/debian/postinst ${PROJECT_SOURCE_DIR}/deploy/debian/prerm
    ${PROJECT_SOURCE_DIR}/deploy/debian/postrm ${PROJECT_SOURCE_DIR}/deploy/debian/conffiles)
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SUGGESTS "python3-ferry")

set(CPACK_DEBIAN_LIBS_PACKAGE_NAME libferry1)
set(CPACK_DEBIAN_LIBS_PACKAGE_SECTION libs)
set(CPACK_COMPONENT_LIBS_DESCRIPTION
    "ferry client libraries\n libferry.so.1, the stable C ABI, and libferry_client.so.0, the C++ client\n library, for trainers that take batches from ferryd.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libferry-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DEPENDS libs)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libabsl-dev, libprotobuf-dev")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "ferry client: headers, pkg-config files and CMake package\n find_package(ferry) gives ferry::client (C++) and ferry::c (C ABI); pkg-config\n names ferry and ferry-client.")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-ferry)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE all)
set(CPACK_COMPONENT_PYTHON_DEPENDS libs)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3 (>= 3.9), python3-numpy")
set(CPACK_DEBIAN_PYTHON_PACKAGE_RECOMMENDS "ferryd, python3-torch")
set(CPACK_COMPONENT_PYTHON_DESCRIPTION
    "ferry client for Python: ferry.Loader, shaped like PyTorch's DataLoader\n Loads libferry.so.1 from libferry1; starts a private ferryd (package ferryd)\n when no daemon is running.")

# A RelWithDebInfo build is mostly DWARF: packages carry stripped binaries.
set(CPACK_STRIP_FILES ON)
# Packages need Debian's layout, which GNUInstallDirs gives only for the /usr prefix (the
# presets set it); cpack refuses a build configured for another prefix.
file(WRITE ${PROJECT_BINARY_DIR}/CPackProjectConfig.cmake
"if(NOT \"${CMAKE_INSTALL_PREFIX}\" STREQUAL \"/usr\")
  message(FATAL_ERROR \"ferry packages need a build configured with CMAKE_INSTALL_PREFIX=/usr \"
                      \"(this one has ${CMAKE_INSTALL_PREFIX}): cmake -DCMAKE_INSTALL_PREFIX=/usr ${PROJECT_BINARY_DIR}\")
endif()
")
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_BINARY_DIR}/CPackProjectConfig.cmake)

include(CPack)
