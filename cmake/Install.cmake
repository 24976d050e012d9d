# `cmake --install` (and `./weft install PREFIX`): the layer libraries, their public headers under
# include/weft/, the weft command, and a CMake package and a pkg-config file through which other
# projects use them:
#
#   find_package(weft CONFIG REQUIRED)            pkg-config --cflags --libs weft
#   target_link_libraries(app PRIVATE weft::weft)
#
# weft::weft is the whole library (every layer, the testing helpers included); weft::authoring is
# the layers below data/, amp/, models/ and dist/. Included from the top-level CMakeLists.txt after the
# layers are defined.
include(CMakePackageConfigHelpers)

set(WEFT_LAYERS core ops autodiff nn optim testing data amp models)
if(TARGET weft_dist)
  list(APPEND WEFT_LAYERS dist)
endif()
set(weft_layer_targets)
foreach(layer ${WEFT_LAYERS})
  list(APPEND weft_layer_targets weft_${layer})
endforeach()

# Everything a program using weft links: the target installed as weft::weft.
add_library(weft_package INTERFACE)
target_link_libraries(weft_package INTERFACE ${weft_layer_targets} weft)
set_target_properties(weft_package PROPERTIES EXPORT_NAME weft)
add_library(weft::weft ALIAS weft_package)

set(weft_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/weft)
install(TARGETS ${weft_layer_targets} weft weft_package EXPORT weftTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft)
if(TARGET weft_cli)
  # The installed binary keeps the run paths of the libraries it was linked with (CUDA's,
  # OpenBLAS's), and is linked with them in the first place, so installing rewrites nothing.
  set_target_properties(weft_cli PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS weft_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# A layer's cuda/ folder holds its kernels' private headers; no public header includes them.
foreach(layer ${WEFT_LAYERS})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft/${layer}
          FILES_MATCHING PATTERN "*.h" PATTERN "cuda" EXCLUDE)
endforeach()
install(EXPORT weftTargets NAMESPACE weft:: DESTINATION ${weft_cmake_dir})

set(WEFT_PACKAGE_HAS_DIST OFF)
if(TARGET weft_dist)
  set(WEFT_PACKAGE_HAS_DIST ON)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/weftConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/weftConfig.cmake INSTALL_DESTINATION ${weft_cmake_dir})
# 0.x: a minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/weftConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/weftConfig.cmake ${PROJECT_BINARY_DIR}/weftConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/WeftOpenBLAS.cmake
        DESTINATION ${weft_cmake_dir})

# The pkg-config file lists the static libraries in link order (each before the layers it uses)
# and the Debian packages' own pkg-config names for the dependencies.
set(weft_pc_libs "")
foreach(layer models dist amp data testing optim nn autodiff ops core)
  if(layer IN_LIST WEFT_LAYERS)
    string(APPEND weft_pc_libs " -lweft_${layer}")
  endif()
endforeach()
set(weft_pc_requires "eigen3 fmt nlohmann_json openblas")
set(weft_pc_cflags "-std=c++20")
set(weft_pc_extra_libs "-pthread")
if(TARGET weft_dist)
  string(APPEND weft_pc_requires " ucx libcrypto")
endif()
if(WEFT_HAVE_IMAGE_FILES)
  string(APPEND weft_pc_requires " libjpeg libpng")
  string(APPEND weft_pc_cflags " -DWEFT_HAVE_IMAGE_FILES")
endif()
if(WEFT_HAVE_CUDA)
  # The CUDA runtime statically; cuBLAS, cuDNN and NCCL are opened at run time.
  string(APPEND weft_pc_cflags " -DWEFT_HAVE_CUDA -I${CUDAToolkit_INCLUDE_DIRS}")
  string(APPEND weft_pc_extra_libs " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
  if(CUDNN_LIBRARY)
    string(APPEND weft_pc_cflags " -DWEFT_HAVE_CUDNN")
  endif()
  if(NCCL_LIBRARY)
    string(APPEND weft_pc_cflags " -DWEFT_HAVE_NCCL")
  endif()
endif()
# The prefix is found from the file's own place, so `cmake --install --prefix` anywhere works.
file(RELATIVE_PATH weft_pc_to_prefix /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
configure_file(${PROJECT_SOURCE_DIR}/cmake/weft.pc.in ${PROJECT_BINARY_DIR}/weft.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/weft.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
