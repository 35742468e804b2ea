// devbuf inspect FILE [--json]: the tensors of a safetensors file, from its header alone.
#include "commands.h"
#include "devbuf.h"
#include "printable.h"
#include "usage.h"

#include <stdio.h>
#include <string.h>

static void print_shape(const devbuf_tensor_info_t *info, FILE *out) {
  fputc('[', out);
  for (size_t d = 0; d < info->ndim; d++) fprintf(out, d ? ", %zu" : "%zu", info->shape[d]);
  fputc(']', out);
}

static void print_json(const char *path, const devbuf_tensor_file_t *file, FILE *out) {
  fprintf(out, "{\n  \"file\": ");
  devbuf_tool_json_string(path, out);
  fprintf(out, ",\n  \"header_size\": %llu,\n  \"data_size\": %llu,\n  \"metadata\": {",
          (unsigned long long)devbuf_tensor_file_header_size(file),
          (unsigned long long)devbuf_tensor_file_data_size(file));
  for (size_t i = 0; i < devbuf_tensor_file_metadata_count(file); i++) {
    const char *key, *value;
    devbuf_tensor_file_metadata(file, i, &key, &value);
    fprintf(out, i ? ", " : "");
    devbuf_tool_json_string(key, out);
    fprintf(out, ": ");
    devbuf_tool_json_string(value, out);
  }
  fprintf(out, "},\n  \"tensors\": [");
  for (size_t i = 0; i < devbuf_tensor_file_count(file); i++) {
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(file, i, &info);
    fprintf(out, "%s\n    {\"name\": ", i ? "," : "");
    devbuf_tool_json_string(info.name, out);
    fprintf(out, ", \"dtype\": \"%s\", \"shape\": ", devbuf_dtype_safetensors_name(info.dtype));
    print_shape(&info, out);
    fprintf(out, ", \"bytes\": %llu, \"data_offsets\": [%llu, %llu], \"file_offset\": %llu}",
            (unsigned long long)(info.end - info.begin), (unsigned long long)info.begin,
            (unsigned long long)info.end, (unsigned long long)info.file_offset);
  }
  fprintf(out, "%s]\n}\n", devbuf_tensor_file_count(file) ? "\n  " : "");
}

static void print_table(const char *path, const devbuf_tensor_file_t *file, FILE *out) {
  size_t count = devbuf_tensor_file_count(file);
  char safe_path[512];
  fprintf(out, "%s: %zu tensors, header %llu bytes, data %llu bytes\n",
          devbuf_tool_printable(path, safe_path, sizeof safe_path), count,
          (unsigned long long)devbuf_tensor_file_header_size(file),
          (unsigned long long)devbuf_tensor_file_data_size(file));
  for (size_t i = 0; i < devbuf_tensor_file_metadata_count(file); i++) {
    const char *key, *value;
    devbuf_tensor_file_metadata(file, i, &key, &value);
    char safe_key[256], safe_value[1024];
    fprintf(out, "  metadata %s = %s\n", devbuf_tool_printable(key, safe_key, sizeof safe_key),
            devbuf_tool_printable(value, safe_value, sizeof safe_value));
  }
  size_t width = 4;
  for (size_t i = 0; i < count; i++) {
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(file, i, &info);
    size_t length = strlen(info.name);
    if (length > width) width = length < 60 ? length : 60;
  }
  fprintf(out, "  %-*s  %-11s %-20s %14s  %s\n", (int)width, "name", "dtype", "shape", "bytes",
          "offsets");
  for (size_t i = 0; i < count; i++) {
    devbuf_tensor_info_t info;
    devbuf_tensor_file_info(file, i, &info);
    char shape[64], name[256];
    devbuf_tool_shape_text(info.shape, info.ndim, ", ", shape, sizeof shape);
    fprintf(out, "  %-*s  %-11s %-20s %14llu  [%llu, %llu)\n", (int)width,
            devbuf_tool_printable(info.name, name, sizeof name),
            devbuf_dtype_safetensors_name(info.dtype), shape,
            (unsigned long long)(info.end - info.begin), (unsigned long long)info.begin,
            (unsigned long long)info.end);
  }
}

int devbuf_cmd_inspect(int argc, char **argv) {
  const char *path = NULL;
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (devbuf_tool_wants_help(argv[i])) return devbuf_tool_help("inspect");
    if (strcmp(argv[i], "--json") == 0)
      json = 1;
    else if (!path && argv[i][0] != '-')
      path = argv[i];
    else
      return devbuf_tool_unexpected("inspect", argv[i], " (one FILE only)");
  }
  if (!path) return devbuf_tool_misuse("inspect", "FILE is needed");
  devbuf_tensor_file_t *file;
  if (devbuf_safetensors_inspect(path, &file) != DEVBUF_OK) {
    devbuf_tool_report("inspect", path);
    return 1;
  }
  if (json)
    print_json(path, file, stdout);
  else
    print_table(path, file, stdout);
  devbuf_tensor_file_release(file);
  return 0;
}
