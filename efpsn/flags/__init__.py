"""The run parameters as the outside names them (flags, environment variables) and the shared
command-line plumbing."""
