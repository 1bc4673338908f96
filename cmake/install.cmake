# `make install` / `cmake --install`: the binaries, and the C++ client library with its
# headers and a CMake package, so that another project can write
#   find_package(attnserve REQUIRED)
#   target_link_libraries(app PRIVATE attnserve::client)
# (tests/install builds such a project against an installed tree).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS attnserve attnctl attnbench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS attnserve_client attnserve_transport attnserve_proto attnserve_warnings
  EXPORT attnserveTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES client/attention_client.h client/npy.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/client)
install(FILES transport/transport.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/transport)
install(FILES
  ${PROJECT_BINARY_DIR}/proto/attnserve/v1/tensor.pb.h
  ${PROJECT_BINARY_DIR}/proto/attnserve/v1/attention.pb.h
  ${PROJECT_BINARY_DIR}/proto/attnserve/v1/attention.grpc.pb.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attnserve/v1)
install(FILES
  ${PROJECT_BINARY_DIR}/proto/grpc/health/v1/health.pb.h
  ${PROJECT_BINARY_DIR}/proto/grpc/health/v1/health.grpc.pb.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/grpc/health/v1)
# KServe v2 (the client's repository calls: load, unload, index).
install(FILES
  ${PROJECT_BINARY_DIR}/proto/inference/grpc_service.pb.h
  ${PROJECT_BINARY_DIR}/proto/inference/grpc_service.grpc.pb.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/inference)
install(FILES proto/attnserve/v1/tensor.proto proto/attnserve/v1/attention.proto
  DESTINATION ${CMAKE_INSTALL_DATADIR}/attnserve/proto/attnserve/v1)

install(EXPORT attnserveTargets NAMESPACE attnserve::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attnserve)
configure_package_config_file(cmake/attnserveConfig.cmake.in
  ${PROJECT_BINARY_DIR}/attnserveConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attnserve)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/attnserveConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/attnserveConfig.cmake
  ${PROJECT_BINARY_DIR}/attnserveConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attnserve)
