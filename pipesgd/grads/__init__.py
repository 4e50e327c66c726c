"""The gradients and replicas on the training thread (the "step -> buckets" and "apply" stages): flat buckets and
the bucket sets ``p.grad`` views (``buckets``, ``bucket_sets``), the applied gradient's clipping, fp16 loss scale and
finiteness (``clipping``, ``amp``, ``finite``), module buffers kept identical (``buffers``) and the check that
replicas are (``replica_check``).
"""
