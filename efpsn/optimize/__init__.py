"""Phase II without I/O: the round driver around an algorithm's step, the stop rule, its
certificate, the channels."""
