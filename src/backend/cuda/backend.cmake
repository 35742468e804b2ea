# The CUDA backend: the driver is found at run time (dlopen), never linked.
devbuf_backend(cuda SOURCES cuda_loader.c backend_cuda.c cuda_queue.c cuda_vmm.c cuda_share.c)
# devbuf's CUDA kernels, embedded when nvcc is there (without it, fills with unusual
# patterns go through host staging).
find_program(DEVBUF_NVCC nvcc PATHS /usr/local/cuda/bin)
if(DEVBUF_NVCC)
  set(builtins_fatbin ${CMAKE_CURRENT_BINARY_DIR}/cuda_builtins.fatbin)
  add_custom_command(OUTPUT ${builtins_fatbin}
    COMMAND ${DEVBUF_NVCC} -fatbin -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
            -gencode arch=compute_90,code=compute_90 -o ${builtins_fatbin} ${CMAKE_CURRENT_LIST_DIR}/cuda_builtins.cu
    DEPENDS ${CMAKE_CURRENT_LIST_DIR}/cuda_builtins.cu COMMENT "nvcc: devbuf's CUDA kernels")
  add_custom_command(OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/cuda_builtins_fatbin.c
    COMMAND ${CMAKE_COMMAND} -DINPUT=${builtins_fatbin} -DOUTPUT=${CMAKE_CURRENT_BINARY_DIR}/cuda_builtins_fatbin.c
            -DNAME=devbuf__cuda_builtins -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed.cmake
    DEPENDS ${builtins_fatbin} ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed.cmake)
  list(APPEND DEVBUF_SOURCES ${CMAKE_CURRENT_BINARY_DIR}/cuda_builtins_fatbin.c)
  list(APPEND DEVBUF_LIBRARY_DEFINITIONS DEVBUF_CUDA_BUILTINS)
endif()
