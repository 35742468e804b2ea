# The null backend: host memory, kernels refused; the tests' proof that a backend is its
# folder and one registry entry. TEST_ONLY: built into the tests' library, never installed.
devbuf_backend(null TEST_ONLY SOURCES backend_null.c)
