"""lowering: the status codes a kernel returns → one light module (the emitted code and the runtime agree on them)."""

ERROR_INDEX = 1  # error = [code, check id, dim, value]
ERROR_DIVISION = 2
ERROR_CANCELLED = 3  # the cancel word was set (an interrupted call); error[] untouched
ERROR_MEMORY = 4  # error = [code, bytes]: scratch memory (a packed convolution filter) could not be allocated
