# install(): libraries, headers, a CMake package (find_package(topoccl)) and a pkg-config file.
include(CMakePackageConfigHelpers)

install(TARGETS topoccl_shared nccl_shared EXPORT topocclTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/nccl.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/topoccl DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(EXPORT topocclTargets NAMESPACE topoccl:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/topoccl)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/topocclConfig.cmake.in
  ${PROJECT_BINARY_DIR}/topocclConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/topoccl)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/topocclConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/topocclConfig.cmake ${PROJECT_BINARY_DIR}/topocclConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/topoccl)

configure_file(${PROJECT_SOURCE_DIR}/cmake/topoccl.pc.in ${PROJECT_BINARY_DIR}/topoccl.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/topoccl.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
