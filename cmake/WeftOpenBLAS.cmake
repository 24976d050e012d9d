# OpenBLAS's CBLAS as the imported target weft::OpenBLAS. weft's build and its installed CMake
# package both include this file, so a project using an installed weft finds the library on its
# own machine rather than at the path weft was built with. WEFT_DEPS_ROOT (packages unpacked by
# tools/gather-deps) is searched first when set.
if(TARGET weft::OpenBLAS)
  return()
endif()
set(_weft_blas_roots /usr)
if(WEFT_DEPS_ROOT)
  list(PREPEND _weft_blas_roots ${WEFT_DEPS_ROOT})
endif()
set(_weft_blas_includes)
set(_weft_blas_libraries)
foreach(root ${_weft_blas_roots})
  foreach(arch x86_64-linux-gnu aarch64-linux-gnu)
    list(APPEND _weft_blas_includes ${root}/include/${arch}/openblas-pthread)
    list(APPEND _weft_blas_libraries ${root}/lib/${arch}/openblas-pthread)
  endforeach()
  list(APPEND _weft_blas_includes ${root}/include/openblas)
endforeach()
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATHS ${_weft_blas_includes} NO_DEFAULT_PATH)
find_library(OPENBLAS_LIBRARY NAMES openblas PATHS ${_weft_blas_libraries} NO_DEFAULT_PATH)
if(NOT OPENBLAS_INCLUDE_DIR OR NOT OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS not found: install libopenblas-dev (./weft does this)")
endif()
add_library(weft::OpenBLAS UNKNOWN IMPORTED)
set_target_properties(weft::OpenBLAS PROPERTIES IMPORTED_LOCATION ${OPENBLAS_LIBRARY}
                      INTERFACE_INCLUDE_DIRECTORIES ${OPENBLAS_INCLUDE_DIR})
