"""interop: objects of other array libraries ⇄ NumPy arrays (dlpack.py), and PyTorch custom ops (torch_op.py).

Nothing here imports torch at module level: torch_op.py is imported only by `tensorlang.torch`.
"""
