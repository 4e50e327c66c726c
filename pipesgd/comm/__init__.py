"""How gradients travel (the "exchange, in the background" stage of the data path): who sends to whom
(``topology``), the per-hop compressed ring (``ring``), one step's buckets through it or the backend's all-reduce
(``exchange``), the background worker and its channel (``worker``, ``channel``), the one asynchronous seam
(``handles``), the agreement on which ranks still train (``uneven``) and the process-group rule (``groups``).
"""
