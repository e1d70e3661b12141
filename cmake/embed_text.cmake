# Writes a text file into a C++ include as a char array initializer (cmake -P):
#   cmake -DIN=page.html -DOUT=page.html.inc -P embed_text.cmake
# The include holds the bytes as hex literals ending in a NUL, so any content embeds unchanged
# (no raw-string delimiter to collide with, no length limit of a string literal).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
# 32 bytes a line keeps the generated file readable and the compiler's lines short.
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){32})" "\\1\n" body "${body}")
file(WRITE "${OUT}.tmp" "${body}0x00\n")
file(RENAME "${OUT}.tmp" "${OUT}")
