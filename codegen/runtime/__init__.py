"""runtime: a compiled plan + the caller's arrays → checked arguments, storage, threads, results."""
