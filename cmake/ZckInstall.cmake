# install(): library, public header, pkg-config file and a CMake package config,
# so that a C project can `find_package(zckpt)` or `pkg-config --libs zckpt`.
include(CMakePackageConfigHelpers)
install(TARGETS zckpt zckpt_shared EXPORT zckptTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS zckpt-cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET zckpt-train)
  install(TARGETS zckpt-train RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(FILES ${PROJECT_SOURCE_DIR}/include/zck.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT zckptTargets NAMESPACE zckpt:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zckpt)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zckptConfig.cmake.in
  ${PROJECT_BINARY_DIR}/zckptConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zckpt)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zckptConfigVersion.cmake COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zckptConfig.cmake ${PROJECT_BINARY_DIR}/zckptConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindXXHash.cmake ${PROJECT_SOURCE_DIR}/cmake/FindISAL.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zckpt)
set(ZCK_PC_MPI "")
if(ZCK_HAVE_MPI)
  set(ZCK_PC_MPI " ompi-c")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/zckpt.pc.in ${PROJECT_BINARY_DIR}/zckpt.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/zckpt.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
