"""Sans-IO protocol core: no sockets, no files, no clock; `now` is always a parameter."""
