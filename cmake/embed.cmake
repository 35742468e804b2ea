# Writes a C file holding the bytes of INPUT as `const unsigned char NAME[]` and its size as
# `const size_t NAME_size`: cmake -DINPUT=... -DOUTPUT=... -DNAME=... -P embed.cmake
# A zero byte follows the bytes (not counted in the size), so that text such as PTX is a string.
file(READ "${INPUT}" bytes HEX)
string(LENGTH "${bytes}" length)
math(EXPR size "${length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${bytes}")
file(WRITE "${OUTPUT}" "#include <stddef.h>\n_Alignas(64) const unsigned char ${NAME}[] = {${bytes}0x00};\nconst size_t ${NAME}_size = ${size};\n")
