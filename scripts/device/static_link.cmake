# Links every executable of a build statically against the Debian libraries,
# so that loom-trainer and the GPU test binaries built on the Debian build
# machine run on the device machine, which has glibc, the CUDA driver and the
# PyTorch wheels' libcublasLt.so.13 and libnccl.so.2, and nothing else we use
# (no Abseil, yaml-cpp, OpenBLAS, libgomp, GoogleTest). Used only by
# scripts/device/build_gpu_trainer.sh, as
#   cmake ... -DCMAKE_PROJECT_INCLUDE=scripts/device/static_link.cmake
# so the normal build is untouched. It runs right after project(); the part
# that needs the imported targets (found later by the top-level
# CMakeLists.txt) is deferred to the end of the top-level directory.
#
# What it does:
#  - libstdc++ and libgcc static (-static-libstdc++ -static-libgcc);
#  - --as-needed, so a library nothing calls (Gloo, for the standalone
#    trainer) leaves no dynamic dependency behind;
#  - libgomp static (FindOpenMP's OpenMP_gomp_LIBRARY, set before
#    kernels/CMakeLists.txt looks for it);
#  - every imported target whose library is a Debian .so with a .a beside it
#    (Abseil, yaml-cpp) is pointed at the .a; OPENBLAS_LIBRARY at the static
#    OpenBLAS; CUDA::cudart at libcudart_static.a.
# Libraries without a static archive (libcublasLt, libnccl, Gloo) stay
# dynamic: build_gpu_trainer.sh checks with ldd that only the allowed ones
# remain.

string(APPEND CMAKE_EXE_LINKER_FLAGS " -static-libstdc++ -static-libgcc -Wl,--as-needed")

execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libgomp.a
                OUTPUT_VARIABLE _loom_gomp_a OUTPUT_STRIP_TRAILING_WHITESPACE)
if(EXISTS "${_loom_gomp_a}")
  set(OpenMP_gomp_LIBRARY "${_loom_gomp_a}" CACHE FILEPATH "libgomp, static (static_link.cmake)" FORCE)
endif()

foreach(_loom_blas /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.a
                   /usr/lib/x86_64-linux-gnu/libopenblas.a)
  if(EXISTS ${_loom_blas})
    set(OPENBLAS_LIBRARY ${_loom_blas} CACHE FILEPATH "OpenBLAS, static (static_link.cmake)" FORCE)
    break()
  endif()
endforeach()

function(_loom_static_location target)
  get_target_property(type ${target} TYPE)
  if(NOT type STREQUAL "SHARED_LIBRARY" AND NOT type STREQUAL "UNKNOWN_LIBRARY")
    return()
  endif()
  get_target_property(configs ${target} IMPORTED_CONFIGURATIONS)
  set(props IMPORTED_LOCATION)
  if(configs)
    foreach(config ${configs})
      list(APPEND props IMPORTED_LOCATION_${config})
    endforeach()
  endif()
  foreach(prop ${props})
    get_target_property(location ${target} ${prop})
    if(NOT location OR NOT location MATCHES "^(.*/lib[^/]+)\\.so(\\.[0-9.]+)?$")
      continue()
    endif()
    set(archive "${CMAKE_MATCH_1}.a")
    if(EXISTS "${archive}")
      set_target_properties(${target} PROPERTIES ${prop} "${archive}")
    endif()
  endforeach()
endfunction()

function(_loom_make_static)
  get_property(targets DIRECTORY ${CMAKE_SOURCE_DIR} PROPERTY IMPORTED_TARGETS)
  foreach(target ${targets})
    if(target MATCHES "^CUDA::")
      continue()
    endif()
    _loom_static_location(${target})
  endforeach()
  if(TARGET CUDA::cudart AND TARGET CUDA::cudart_static)
    get_target_property(cudart_static CUDA::cudart_static IMPORTED_LOCATION)
    if(cudart_static)
      set_target_properties(CUDA::cudart PROPERTIES IMPORTED_LOCATION "${cudart_static}")
      set_property(TARGET CUDA::cudart APPEND PROPERTY INTERFACE_LINK_LIBRARIES
                   Threads::Threads ${CMAKE_DL_LIBS} rt)
    endif()
  endif()
  message(STATUS "Loom: static_link.cmake: imported libraries pointed at static archives; "
                 "OpenBLAS ${OPENBLAS_LIBRARY}; libgomp ${OpenMP_gomp_LIBRARY}")
endfunction()

cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL _loom_make_static)
