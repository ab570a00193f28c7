"""Background commands: start, list, read, stop on records; the supervisor, its gate, its output file; the sweep."""
