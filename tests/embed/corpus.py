"""How the embedding tests read a corpus file (devbuf-embed reads it the same way): the file
split on '\\n'; the '\\n' ending the last line does not start another, empty, line; every other
empty line is a sentence of its own; nothing else is stripped ('\\r' stays: the tokenizer
treats it as whitespace)."""


def read_lines(path):
    """The file's bytes and its lines as bytes."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return data, lines


def read_corpus(path):
    """The file's bytes and its lines, decoded as UTF-8 (strict)."""
    data, lines = read_lines(path)
    return data, [line.decode("utf-8") for line in lines]
