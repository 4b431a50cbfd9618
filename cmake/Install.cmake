# `cmake --install BUILD --prefix P`: the troupe command, the libraries, the public headers and a
# CMake package (find_package(Troupe) -> Troupe::troupe). docs/api.md lists the public headers
# and what is stable.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The public headers: the API a program of its own uses. Installed under include/troupe/ with
# their folders (#include <troupe/models/blocks.h>); the headers they include come along.
set(TROUPE_PUBLIC_HEADERS
  cli/main.h
  models/extension.h models/blocks.h models/tensor.h models/model.h models/data.h
  models/kernels.h models/random.h models/compute.h
  workers/elastic_loop.h
  coordinator/job.h coordinator/config.h workers/agent.h workers/faults.h)

# The libraries behind them, every one (static), and one target that carries them all.
set(TROUPE_LIBRARIES troupe_frame troupe_comm troupe_models troupe_data troupe_elastic
    troupe_job_protocol troupe_actors troupe_config troupe_checkpoints troupe_metrics troupe_roster
    troupe_coordinator troupe_worker troupe_workers troupe_nccl_bench troupe_kernels_bench troupe_bench troupe_cli)
add_library(troupe_package INTERFACE)
set_target_properties(troupe_package PROPERTIES EXPORT_NAME troupe)
target_link_libraries(troupe_package INTERFACE ${TROUPE_LIBRARIES})
# <troupe/...> for the program and for the headers' own includes, which are installed as
# "troupe/models/x.h" (below): a project's own models/x.h cannot stand in for Troupe's.
target_include_directories(troupe_package INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(TARGETS troupe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET troupe_cuda)  # (models/devices.cpp looks in PREFIX/lib/troupe/ next)
  install(TARGETS troupe_cuda LIBRARY DESTINATION lib/troupe)
endif()
install(TARGETS ${TROUPE_LIBRARIES} troupe_package EXPORT TroupeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}/troupe)
foreach(h ${TROUPE_PUBLIC_HEADERS})
  get_filename_component(dir ${h} DIRECTORY)
  file(READ ${CMAKE_SOURCE_DIR}/${h} text)
  string(REGEX REPLACE "#include \"(actors|cli|comm|coordinator|data|elastic|models|workers)/"
         "#include \"troupe/\\1/" text "${text}")
  file(WRITE ${CMAKE_BINARY_DIR}/public/troupe/${h} "${text}")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/${h})
  install(FILES ${CMAKE_BINARY_DIR}/public/troupe/${h}
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/${dir})
endforeach()
install(EXPORT TroupeTargets NAMESPACE Troupe:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Troupe)
configure_package_config_file(cmake/TroupeConfig.cmake.in
  ${CMAKE_BINARY_DIR}/TroupeConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Troupe)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/TroupeConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/TroupeConfig.cmake ${CMAKE_BINARY_DIR}/TroupeConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Troupe)
