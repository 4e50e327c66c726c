"""How gradients travel (the "exchange, in the background" stage of the data path): who sends to whom (``topology``),
the paper's per-hop compressed ring (``ring``), the two-collective compressed all-reduce (``alltoall`` over
``payload_collectives``), one step's buckets through one of them or the backend's all-reduce (``exchange``), the
background worker and its channel (``worker``, ``channel``), the one asynchronous seam (``handles``), the agreement
on which ranks still train (``uneven``) and the process-group rule (``groups``).
"""
