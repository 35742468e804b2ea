// Status names and messages, and a failure's message that carries its cause; the dtype
// table: names, bits, DLPack codes, byte sizes.
#include "../src/base/base.h"
#include "check.h"

static void test_status_table(void) {
  CHECK(strcmp(devbuf_status_name(DEVBUF_OK), "OK") == 0);
  CHECK(strcmp(devbuf_status_name(DEVBUF_OUT_OF_MEMORY), "OUT_OF_MEMORY") == 0);
  CHECK(strcmp(devbuf_status_name((devbuf_status)999), "UNKNOWN") == 0);
  CHECK(strlen(devbuf_status_str(DEVBUF_IN_USE)) > 0);
  CHECK(strcmp(devbuf_status_str((devbuf_status)999), "unknown status") == 0);
  CHECK_STATUS(devbuf_set_error(DEVBUF_TIMEOUT, "waited %d ms", 42), DEVBUF_TIMEOUT);
  CHECK(strcmp(devbuf_last_error(), "TIMEOUT: waited 42 ms") == 0);
}

// A failure caused by another names both, the cause last with its own status; a chain too
// long for the message loses its tail, never its head; sizes read as people write them.
static void test_cause_chain(void) {
  devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "the system refused %d bytes", 4096);
  CHECK_STATUS(devbuf__error_cause(DEVBUF_DEVICE_FAILURE, "queue %d failed", 3),
               DEVBUF_DEVICE_FAILURE);
  CHECK(strcmp(devbuf_last_error(), "DEVICE_FAILURE: queue 3 failed: OUT_OF_MEMORY: the system "
                                    "refused 4096 bytes") == 0);
  char long_text[600];
  memset(long_text, 'x', sizeof long_text - 1);
  long_text[sizeof long_text - 1] = '\0';
  devbuf_set_error(DEVBUF_IO_ERROR, "%s", long_text);
  devbuf__error_cause(DEVBUF_FORMAT_ERROR, "reading '%s'", "model.safetensors");
  const char *message = devbuf_last_error();
  const char *head = "FORMAT_ERROR: reading 'model.safetensors': IO_ERROR: xxx";
  CHECK(strncmp(message, head, strlen(head)) == 0);
  CHECK(strlen(message) == 511); // cut at the end of the thread's message
  devbuf__clear_error();
  devbuf__error_cause(DEVBUF_TIMEOUT, "waiting"); // no cause: the context alone
  CHECK(strcmp(devbuf_last_error(), "TIMEOUT: waiting") == 0);
  char text[32];
  CHECK(strcmp(devbuf__bytes_text(1, text), "1 byte") == 0);
  CHECK(strcmp(devbuf__bytes_text(100, text), "100 bytes") == 0);
  CHECK(strcmp(devbuf__bytes_text(4096, text), "4 KiB") == 0);
  CHECK(strcmp(devbuf__bytes_text(1536 * 1024, text), "1.5 MiB") == 0);
  CHECK(strcmp(devbuf__bytes_text((uint64_t)64 << 20, text), "64 MiB") == 0);
  CHECK(strcmp(devbuf__bytes_text(UINT64_MAX, text), "16 EiB") == 0);
  CHECK(strcmp(devbuf__bytes_text((1u << 20) - 1, text), "1.0 MiB") == 0); // not "1024.0 KiB"
  CHECK(strcmp(devbuf__bytes_text((1u << 30) - 1, text), "1.0 GiB") == 0);

  // A caller that wraps the last error in its own words (as a user's allocator may).
  devbuf_set_error(DEVBUF_IO_ERROR, "first cause %d", 7);
  devbuf_set_error(DEVBUF_DEVICE_FAILURE, "wrapped: %s", devbuf_last_error());
  CHECK(strcmp(devbuf_last_error(), "DEVICE_FAILURE: wrapped: IO_ERROR: first cause 7") == 0);
  // Messages stay UTF-8 a reader decodes: a name cut inside a character by a precision, or a
  // byte of another encoding, shows as \xNN; a character the message's end would cut goes.
  char name[104];
  memset(name, 'a', 99);
  memcpy(name + 99, "\xc3\xa9z", 4); // "é" at bytes 99-100
  devbuf_set_error(DEVBUF_FORMAT_ERROR, "tensor '%.100s' is odd", name);
  char expected[160];
  snprintf(expected, sizeof expected, "FORMAT_ERROR: tensor '%.99s\\xc3' is odd", name);
  CHECK(strcmp(devbuf_last_error(), expected) == 0);
  devbuf_set_error(DEVBUF_IO_ERROR, "cannot open '%s'", "caf\xe9.bin"); // Latin-1
  CHECK(strcmp(devbuf_last_error(), "IO_ERROR: cannot open 'caf\\xe9.bin'") == 0);
  // Control characters a terminal acts on (ESC, C1's CSI, DEL, a carriage return) show as
  // \xNN: a tensor name from a hostile file restyled or rewrote the log line. Newlines and
  // tabs stay (build logs).
  devbuf_set_error(DEVBUF_FORMAT_ERROR, "tensor '%s'",
                   "a\x1b[31mb\rc\x01"
                   "d\x7f\xc2\x9b\ne\tf");
  CHECK(strcmp(devbuf_last_error(),
               "FORMAT_ERROR: tensor 'a\\x1b[31mb\\x0dc\\x01d\\x7f\\xc2\\x9b\ne\tf'") == 0);
  char wide[600] = "";
  for (int i = 0; i < 299; i++) strcat(wide, "\xc3\xa9"); // 598 bytes of "é"
  devbuf_set_error(DEVBUF_IO_ERROR, "%s", wide);
  const char *cut = devbuf_last_error();
  size_t length = strlen(cut);
  CHECK(length <= 511 && length >= 509);
  CHECK(((unsigned char)cut[length - 1] & 0xC0) == 0x80);         // ends on a whole "é"
  devbuf__error_cause(DEVBUF_FORMAT_ERROR, "reading '%s'", wide); // the context cut alike
  cut = devbuf_last_error();
  length = strlen(cut);
  CHECK(((unsigned char)cut[length - 1] & 0xC0) == 0x80);
}

static void test_dtype_table(void) {
  struct {
    devbuf_dtype dtype;
    const char *name;
    unsigned bits;
    uint8_t code;
    const char *st;
  } expected[] = {
      {DEVBUF_BOOL, "bool", 8, 6, "BOOL"},
      {DEVBUF_INT8, "int8", 8, 0, "I8"},
      {DEVBUF_UINT64, "uint64", 64, 1, "U64"},
      {DEVBUF_FLOAT16, "float16", 16, 2, "F16"},
      {DEVBUF_BFLOAT16, "bfloat16", 16, 4, "BF16"},
      {DEVBUF_FLOAT32, "float32", 32, 2, "F32"},
      {DEVBUF_COMPLEX64, "complex64", 64, 5, "C64"},
      {DEVBUF_FLOAT8_E4M3, "float8_e4m3", 8, 10, "F8_E4M3"},
      {DEVBUF_FLOAT8_E5M2, "float8_e5m2", 8, 12, "F8_E5M2"},
      {DEVBUF_FLOAT8_E8M0, "float8_e8m0", 8, 14, "F8_E8M0"},
      {DEVBUF_FLOAT8_E4M3FNUZ, "float8_e4m3fnuz", 8, 11, "F8_E4M3FNUZ"},
      {DEVBUF_FLOAT8_E5M2FNUZ, "float8_e5m2fnuz", 8, 13, "F8_E5M2FNUZ"},
      {DEVBUF_FLOAT6_E2M3, "float6_e2m3", 6, 15, "F6_E2M3"},
      {DEVBUF_FLOAT6_E3M2, "float6_e3m2", 6, 16, "F6_E3M2"},
      {DEVBUF_FLOAT4_E2M1, "float4_e2m1", 4, 17, "F4"},
  };
  for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
    CHECK(strcmp(devbuf_dtype_name(expected[i].dtype), expected[i].name) == 0);
    CHECK_EQ_U(devbuf_dtype_bits(expected[i].dtype), expected[i].bits);
    uint8_t code = 0xff, bits = 0;
    CHECK_OK(devbuf_dtype_dlpack(expected[i].dtype, &code, &bits));
    CHECK_EQ_U(code, expected[i].code);
    CHECK_EQ_U(bits, expected[i].bits);
    CHECK(strcmp(devbuf_dtype_safetensors_name(expected[i].dtype), expected[i].st) == 0);
    devbuf_dtype found;
    CHECK_OK(devbuf_dtype_from_name(expected[i].name, &found));
    CHECK(found == expected[i].dtype);
    CHECK_OK(devbuf_dtype_from_name(expected[i].st, &found));
    CHECK(found == expected[i].dtype);
  }
  // Every dtype has a name, a size and a DLPack code.
  for (int d = 0; d < DEVBUF_DTYPE_COUNT; d++) {
    CHECK(devbuf_dtype_name((devbuf_dtype)d) != NULL);
    CHECK(devbuf_dtype_bits((devbuf_dtype)d) > 0);
  }
  CHECK(devbuf_dtype_name(DEVBUF_DTYPE_COUNT) == NULL);
  CHECK_EQ_U(devbuf_dtype_bits((devbuf_dtype)-1), 0);
  devbuf_dtype found;
  CHECK_STATUS(devbuf_dtype_from_name("float128", &found), DEVBUF_NOT_FOUND);
  CHECK_MESSAGE("float128");
  CHECK_STATUS(devbuf_dtype_dlpack(DEVBUF_DTYPE_COUNT, NULL, NULL), DEVBUF_INVALID_ARGUMENT);
}

static void test_dtype_bytes(void) {
  size_t bytes = 0;
  CHECK_OK(devbuf_dtype_bytes(DEVBUF_FLOAT32, 10, &bytes));
  CHECK_EQ_U(bytes, 40);
  CHECK_OK(devbuf_dtype_bytes(DEVBUF_FLOAT4_E2M1, 6, &bytes));
  CHECK_EQ_U(bytes, 3);
  CHECK_STATUS(devbuf_dtype_bytes(DEVBUF_FLOAT4_E2M1, 3, &bytes), DEVBUF_INVALID_ARGUMENT);
  CHECK_MESSAGE("3 elements of float4_e2m1 (4 bits each) end 4 bits into a byte");
  CHECK_OK(devbuf_dtype_bytes(DEVBUF_FLOAT6_E2M3, 4, &bytes));
  CHECK_EQ_U(bytes, 3);
  CHECK_STATUS(devbuf_dtype_bytes(DEVBUF_FLOAT6_E3M2, 2, &bytes), DEVBUF_INVALID_ARGUMENT);
  CHECK_STATUS(devbuf_dtype_bytes(DEVBUF_FLOAT64, SIZE_MAX / 4, &bytes), DEVBUF_OVERFLOW);
  // Sub-byte elements take fewer bytes than their count: never an overflow, though the bits
  // would overflow (they did).
  CHECK_OK(devbuf_dtype_bytes(DEVBUF_FLOAT4_E2M1, SIZE_MAX - 1, &bytes));
  CHECK_EQ_U(bytes, (SIZE_MAX - 1) / 2);
  CHECK_OK(devbuf_dtype_bytes(DEVBUF_FLOAT6_E2M3, SIZE_MAX / 8 * 4, &bytes));
  CHECK_EQ_U(bytes, SIZE_MAX / 8 * 3);
  CHECK_OK(devbuf_dtype_bytes(DEVBUF_FLOAT6_E3M2, SIZE_MAX - 7, &bytes));
  CHECK_EQ_U(bytes, (SIZE_MAX - 7) / 8 * 6);
  CHECK_STATUS(devbuf_dtype_bytes(DEVBUF_FLOAT4_E2M1, SIZE_MAX, &bytes), DEVBUF_INVALID_ARGUMENT);
  CHECK_OK(devbuf_dtype_bytes(DEVBUF_INT8, 0, &bytes));
  CHECK_EQ_U(bytes, 0);
}

int main(void) {
  RUN(test_status_table);
  RUN(test_cause_chain);
  RUN(test_dtype_table);
  RUN(test_dtype_bytes);
  return CHECK_EXIT();
}
