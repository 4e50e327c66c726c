"""The sub-commands of ``pipesgd-timing``, one module each (``predict``, ``sweep``, ``recommend``, ``validate``;
``measured_elsewhere`` points ``calibrate`` to ``pipesgd-timing``, which measures with torch),
and the flags and helpers they share (``flags``). Each module offers ``add_parser(sub)`` and ``run(args)``.
"""
