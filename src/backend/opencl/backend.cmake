# The OpenCL backend: the ICD loader is found at run time (dlopen), so this builds anywhere.
devbuf_backend(opencl SOURCES opencl_loader.c backend_opencl.c opencl_queue.c)
